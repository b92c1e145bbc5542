"""Hugging Face tensor names <-> bertjax parameter paths, one key mapping per family.

Layout rules (both directions are written next to each other so they cannot drift apart):
- torch `nn.Linear.weight` is [out, in]; a Flax kernel is [in, out].
- query/key/value kernels are [embed, heads, head_dim] (biases [heads, head_dim]); the attention output kernel
  is [heads, head_dim, embed]. Keeping heads as an axis lets tensor parallelism split them without reshapes.
- ModernBERT fuses q, k, v into `Wqkv` [3 * hidden, hidden], and the GeGLU input and gate into `Wi`
  [2 * intermediate, hidden]: the first half is the activated input (`wi_0`), the second half the gate (`wi_1`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from bertjax.config import EncoderConfig

ParamPath = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one Hugging Face tensor becomes bertjax parameter arrays (`load`) and back (`save`)."""

    load: Callable[[np.ndarray], tuple[np.ndarray, ...]]
    save: Callable[[Sequence[np.ndarray]], np.ndarray]


COPY = Layout(load=lambda x: (x,), save=lambda p: p[0])
TRANSPOSE = Layout(load=lambda w: (w.T,), save=lambda p: p[0].T)


def heads_in(heads: int, head_dim: int) -> Layout:
    """torch [heads * head_dim, embed] <-> kernel [embed, heads, head_dim]."""
    return Layout(load=lambda w: (w.T.reshape(w.shape[1], heads, head_dim),),
                  save=lambda p: p[0].reshape(p[0].shape[0], heads * head_dim).T)


def heads_bias(heads: int, head_dim: int) -> Layout:
    """[heads * head_dim] <-> [heads, head_dim]."""
    return Layout(load=lambda b: (b.reshape(heads, head_dim),), save=lambda p: p[0].reshape(heads * head_dim))


def heads_out(heads: int, head_dim: int) -> Layout:
    """torch [embed, heads * head_dim] <-> kernel [heads, head_dim, embed]."""
    return Layout(load=lambda w: (w.T.reshape(heads, head_dim, w.shape[0]),),
                  save=lambda p: p[0].reshape(heads * head_dim, p[0].shape[-1]).T)


def fused(*parts: Layout) -> Layout:
    """Equal chunks along the first (torch output) axis, each with its own layout."""
    def load(x):
        return tuple(part.load(chunk)[0] for part, chunk in zip(parts, np.split(x, len(parts), axis=0)))

    def save(params):
        return np.concatenate([part.save((p,)) for part, p in zip(parts, params)], axis=0)

    return Layout(load=load, save=save)


@dataclasses.dataclass(frozen=True)
class TensorRule:
    """One tensor of a Hugging Face file and the bertjax parameters it holds."""

    hf_keys: tuple[str, ...]  # names it may carry in a file, preferred first; every one present is consumed
    hf_shape: tuple[int, ...]
    params: tuple[ParamPath, ...]
    layout: Layout
    write_keys: tuple[str, ...] = ()  # names written on save; default: the preferred name

    @property
    def names_to_write(self) -> tuple[str, ...]:
        return self.write_keys or self.hf_keys[:1]


@dataclasses.dataclass(frozen=True)
class KeyMapping:
    rules: list[TensorRule]
    ignored: frozenset[str]  # names accepted in a file and dropped: non-parameter buffers, tied copies
    # Parameters of the family's other heads that this head does not use. Published MLM checkpoints
    # (bert-base-uncased, roberta-base) still carry their pretraining pooler and NSP head; transformers drops them
    # with a warning, and so does bertjax. Any other tensor is an error.
    unused: frozenset[str] = frozenset()


def _rule(key: str, shape: tuple[int, ...], path: ParamPath, layout: Layout = COPY) -> TensorRule:
    return TensorRule((key,), shape, (path,), layout)


def linear(key: str, path: ParamPath, in_dim: int, out_dim: int, bias: bool) -> list[TensorRule]:
    rules = [_rule(f"{key}.weight", (out_dim, in_dim), path + ("kernel",), TRANSPOSE)]
    if bias:
        rules.append(_rule(f"{key}.bias", (out_dim,), path + ("bias",)))
    return rules


def layer_norm(key: str, path: ParamPath, dim: int, bias: bool) -> list[TensorRule]:
    # Checkpoints converted from the original TensorFlow BERT name LayerNorm parameters gamma/beta; transformers
    # still renames them on load, so they are accepted (never written).
    legacy = key.endswith("LayerNorm")
    rules = [TensorRule((f"{key}.weight",) + ((f"{key}.gamma",) if legacy else ()), (dim,), (path + ("scale",),),
                        COPY)]
    if bias:
        rules.append(TensorRule((f"{key}.bias",) + ((f"{key}.beta",) if legacy else ()), (dim,), (path + ("bias",),),
                                COPY))
    return rules


def embedding(key: str, path: ParamPath, rows: int, dim: int) -> list[TensorRule]:
    return [_rule(f"{key}.weight", (rows, dim), path + ("embedding",))]


def attention_projection(key: str, path: ParamPath, cfg: EncoderConfig, heads: int) -> list[TensorRule]:
    rules = [_rule(f"{key}.weight", (heads * cfg.head_dim, cfg.hidden_size), path + ("kernel",),
                   heads_in(heads, cfg.head_dim))]
    if cfg.attention_bias:
        rules.append(_rule(f"{key}.bias", (heads * cfg.head_dim,), path + ("bias",), heads_bias(heads, cfg.head_dim)))
    return rules


def attention_output(key: str, path: ParamPath, cfg: EncoderConfig) -> list[TensorRule]:
    rules = [_rule(f"{key}.weight", (cfg.hidden_size, cfg.hidden_size), path + ("kernel",),
                   heads_out(cfg.num_heads, cfg.head_dim))]
    if cfg.attention_bias:
        rules.append(_rule(f"{key}.bias", (cfg.hidden_size,), path + ("bias",)))
    return rules


def mlm_decoder(prefix: str, bias_keys: tuple[str, ...], cfg: EncoderConfig) -> tuple[list[TensorRule], set[str]]:
    """The MLM decoder: its weight is in the file only when untied; `bias_keys` are the bias's names.

    transformers ties BERT's `decoder.bias` to the head's own `bias` and writes only the latter when the
    embeddings are tied; untied, it writes both and the forward pass uses `decoder.bias`, so that one is read first.
    """
    rules, ignored = [], set()
    if cfg.decoder_bias:
        rules.append(TensorRule(bias_keys, (cfg.vocab_size,), (("mlm_head", "decoder_bias"),), COPY,
                                write_keys=bias_keys if not cfg.tie_word_embeddings else bias_keys[-1:]))
    if cfg.tie_word_embeddings:
        ignored.add(f"{prefix}decoder.weight")  # a tied copy of the word embeddings (older files include it)
    else:
        rules += linear(f"{prefix}decoder", ("mlm_head", "decoder"), cfg.embed_dim, cfg.vocab_size, bias=False)
    return rules, ignored


# --------------------------------------------------------------------------------------------------------------
# BERT / RoBERTa


def bert_layer(key: str, path: ParamPath, cfg: EncoderConfig) -> list[TensorRule]:
    h, i = cfg.hidden_size, cfg.intermediate_size
    return [
        *attention_projection(f"{key}attention.self.query", path + ("attention", "query"), cfg, cfg.num_heads),
        *attention_projection(f"{key}attention.self.key", path + ("attention", "key"), cfg, cfg.kv_heads),
        *attention_projection(f"{key}attention.self.value", path + ("attention", "value"), cfg, cfg.kv_heads),
        *attention_output(f"{key}attention.output.dense", path + ("attention", "out"), cfg),
        *layer_norm(f"{key}attention.output.LayerNorm", path + ("attention_norm",), h, bias=True),
        *linear(f"{key}intermediate.dense", path + ("mlp", "wi"), h, i, bias=True),
        *linear(f"{key}output.dense", path + ("mlp", "wo"), i, h, bias=True),
        *layer_norm(f"{key}output.LayerNorm", path + ("mlp_norm",), h, bias=True),
    ]


@dataclasses.dataclass(frozen=True)
class HeadNames:
    mlm_prefix: str  # "cls.predictions." (BERT) or "lm_head." (RoBERTa)
    mlm_dense: str
    mlm_norm: str
    nsp: str | None  # BERT's next-sentence classifier; RoBERTa has none


def _bert_like(cfg: EncoderConfig, head: str, base_prefix: str, names: HeadNames) -> KeyMapping:
    """`base_prefix` names the base model inside the head classes (`bert.`); the bare model has none."""
    h = cfg.hidden_size
    base = "" if head == "encoder" else base_prefix
    e = f"{base}embeddings."
    rules = [
        *embedding(f"{e}word_embeddings", ("embeddings", "word_embeddings"), cfg.vocab_size, h),
        *embedding(f"{e}position_embeddings", ("embeddings", "position_embeddings"), cfg.max_position_embeddings, h),
        *layer_norm(f"{e}LayerNorm", ("embeddings", "norm"), h, bias=True),
    ]
    if cfg.type_vocab_size:
        rules += embedding(f"{e}token_type_embeddings", ("embeddings", "token_type_embeddings"),
                           cfg.type_vocab_size, h)
    for i in range(cfg.num_layers):
        rules += bert_layer(f"{base}encoder.layer.{i}.", ("encoder", f"layers_{i}"), cfg)
    # Buffers older transformers versions saved alongside the weights.
    ignored = {f"{e}position_ids", f"{e}token_type_ids"}
    pooler = linear(f"{base}pooler.dense", ("pooler", "dense"), h, h, bias=True)
    if head in ("encoder", "pretraining"):
        rules += pooler
    if head in ("masked_lm", "pretraining"):
        p = names.mlm_prefix
        rules += linear(f"{p}{names.mlm_dense}", ("mlm_head", "dense"), h, h, bias=True)
        rules += layer_norm(f"{p}{names.mlm_norm}", ("mlm_head", "norm"), h, bias=True)
        decoder_rules, decoder_ignored = mlm_decoder(p, (f"{p}decoder.bias", f"{p}bias"), cfg)
        rules += decoder_rules
        ignored |= decoder_ignored
    nsp = linear(names.nsp, ("nsp_head", "dense"), h, 2, bias=True) if names.nsp else []
    if head == "pretraining":
        rules += nsp
    unused = [key for rule in (pooler + nsp if head == "masked_lm" else []) for key in rule.hf_keys]
    return KeyMapping(rules, frozenset(ignored), frozenset(unused))


def bert_mapping(cfg: EncoderConfig, head: str) -> KeyMapping:
    return _bert_like(cfg, head, "bert.", HeadNames("cls.predictions.", "transform.dense", "transform.LayerNorm",
                                                          "cls.seq_relationship"))


def roberta_mapping(cfg: EncoderConfig, head: str) -> KeyMapping:
    return _bert_like(cfg, head, "roberta.", HeadNames("lm_head.", "dense", "layer_norm", nsp=None))


# --------------------------------------------------------------------------------------------------------------
# ModernBERT


def modernbert_layer(key: str, path: ParamPath, cfg: EncoderConfig, layer: int) -> list[TensorRule]:
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    attention = path + ("attention",)
    qkv_paths = (attention + ("query",), attention + ("key",), attention + ("value",))
    qkv = heads_in(cfg.num_heads, d)
    rules = [TensorRule((f"{key}attn.Wqkv.weight",), (3 * h, h), tuple(p + ("kernel",) for p in qkv_paths),
                        fused(qkv, qkv, qkv))]
    if cfg.attention_bias:
        qkv_bias = heads_bias(cfg.num_heads, d)
        rules.append(TensorRule((f"{key}attn.Wqkv.bias",), (3 * h,), tuple(p + ("bias",) for p in qkv_paths),
                                fused(qkv_bias, qkv_bias, qkv_bias)))
    rules += attention_output(f"{key}attn.Wo", attention + ("out",), cfg)
    if layer > 0:  # layer 0's attention input is the embedding norm's output: no attn_norm of its own
        rules += layer_norm(f"{key}attn_norm", path + ("attention_norm",), h, cfg.norm_bias)
    rules += layer_norm(f"{key}mlp_norm", path + ("mlp_norm",), h, cfg.norm_bias)
    gate_paths = (path + ("mlp", "wi_0"), path + ("mlp", "wi_1"))  # activated input, then linear gate
    rules.append(TensorRule((f"{key}mlp.Wi.weight",), (2 * i, h), tuple(p + ("kernel",) for p in gate_paths),
                            fused(TRANSPOSE, TRANSPOSE)))
    if cfg.mlp_bias:
        rules.append(TensorRule((f"{key}mlp.Wi.bias",), (2 * i,), tuple(p + ("bias",) for p in gate_paths),
                                fused(COPY, COPY)))
    rules += linear(f"{key}mlp.Wo", path + ("mlp", "wo"), i, h, cfg.mlp_bias)
    return rules


def modernbert_mapping(cfg: EncoderConfig, head: str) -> KeyMapping:
    h = cfg.hidden_size
    base = "model." if head != "encoder" else ""
    rules = [
        *embedding(f"{base}embeddings.tok_embeddings", ("embeddings", "word_embeddings"), cfg.vocab_size, h),
        *layer_norm(f"{base}embeddings.norm", ("embeddings", "norm"), h, cfg.norm_bias),
    ]
    for i in range(cfg.num_layers):
        rules += modernbert_layer(f"{base}layers.{i}.", ("encoder", f"layers_{i}"), cfg, i)
    rules += layer_norm(f"{base}final_norm", ("encoder", "final_norm"), h, cfg.norm_bias)
    ignored: set[str] = set()
    if head == "masked_lm":
        rules += linear("head.dense", ("mlm_head", "dense"), h, h, cfg.head_dense_bias)
        rules += layer_norm("head.norm", ("mlm_head", "norm"), h, cfg.norm_bias)
        decoder_rules, ignored = mlm_decoder("", ("decoder.bias",), cfg)
        rules += decoder_rules
    return KeyMapping(rules, frozenset(ignored))


# model_type -> key mapping for (config, head).
KEY_MAPPINGS: dict[str, Callable[[EncoderConfig, str], KeyMapping]] = {
    "bert": bert_mapping,
    "roberta": roberta_mapping,
    "modernbert": modernbert_mapping,
}
