"""Hugging Face tensor names <-> bertjax parameter paths: the building blocks every family's key mapping uses.

Each family module (`bertjax/hf/bert.py`, ...) lists its tensors with these rules.

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


def attention_projection(key: str, path: ParamPath, cfg: EncoderConfig, heads: int,
                         bias: bool | None = None) -> list[TensorRule]:
    """`bias`: whether the projection has one (default: the config's attention_bias)."""
    rules = [_rule(f"{key}.weight", (heads * cfg.head_dim, cfg.hidden_size), path + ("kernel",),
                   heads_in(heads, cfg.head_dim))]
    if cfg.attention_bias if bias is None else bias:
        rules.append(_rule(f"{key}.bias", (heads * cfg.head_dim,), path + ("bias",), heads_bias(heads, cfg.head_dim)))
    return rules


def attention_output(key: str, path: ParamPath, cfg: EncoderConfig) -> list[TensorRule]:
    # The input is num_heads * head_dim wide, which is not hidden_size when head_dim is explicit (EuroBERT).
    rules = [_rule(f"{key}.weight", (cfg.hidden_size, cfg.num_heads * cfg.head_dim), path + ("kernel",),
                   heads_out(cfg.num_heads, cfg.head_dim))]
    if cfg.attention_bias:
        rules.append(_rule(f"{key}.bias", (cfg.hidden_size,), path + ("bias",)))
    return rules


def mlm_decoder(decoder: str, bias_keys: tuple[str, ...], cfg: EncoderConfig) -> tuple[list[TensorRule], set[str]]:
    """The MLM decoder `decoder` (e.g. "cls.predictions.decoder"): its weight is in the file only when untied.

    `bias_keys` are the names the vocabulary bias may carry, the one written when tied last. transformers ties
    BERT's `decoder.bias` to the head's own `bias` and writes only the latter when the embeddings are tied;
    untied, it writes both and the forward pass uses `decoder.bias`, so that one is read first.
    """
    rules, ignored = [], set()
    if cfg.decoder_bias:
        rules.append(TensorRule(bias_keys, (cfg.vocab_size,), (("mlm_head", "decoder_bias"),), COPY,
                                write_keys=bias_keys if not cfg.tie_word_embeddings else bias_keys[-1:]))
    if cfg.tie_word_embeddings:
        ignored.add(f"{decoder}.weight")  # a tied copy of the word embeddings (older files include it)
    else:
        rules += linear(decoder, ("mlm_head", "decoder"), cfg.embed_dim, cfg.vocab_size, bias=False)
    return rules, ignored
