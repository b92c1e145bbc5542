"""DeBERTa checkpoints: `deberta` (v1: DebertaModel, DebertaForMaskedLM) and `deberta-v2` (v2 and v3:
DebertaV2Model, DebertaV2ForMaskedLM), with their task heads.

Both are BERT's post-norm layers with disentangled attention (bertjax/models/disentangled.py). What differs in
the files: v1 fuses q, k, v into one bias-free `in_proj` whose rows go head by head ([q_h, k_h, v_h] per head) and
keeps `q_bias`/`v_bias` apart, with `pos_proj` (no bias) and `pos_q_proj`; v2 has `query_proj`/`key_proj`/
`value_proj`, `pos_key_proj`/`pos_query_proj` (absent with share_att_key), log buckets, a LayerNorm on the relative
table and an optional convolution. `pos_att_type` is a list or the "p2c|c2p" string older files carry. The MLM
head is `cls.predictions.*` (legacy) or `lm_predictions.lm_head.*`; classification heads pool the first token
through `pooler.dense` and `pooler_hidden_act`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.config import DisentangledAttentionConfig, EncoderConfig
from bertjax.hf.config_common import ACTIVATION_TO_HF, HF_ACTIVATIONS, ConfigReader, Refusals
from bertjax.hf.family import HfFamily
from bertjax.hf.mapping import (KeyMapping, Layout, ParamPath, TensorRule, attention_output, attention_projection,
                                embedding, heads_bias, layer_norm, linear, mlm_decoder)
from bertjax.hf.task_heads import HeadKeys, TaskHeads, architectures, bert_like_keys

# transformers' DebertaConfig / DebertaV2Config defaults (the two classes share them but for these sizes).
_DEFAULTS = {"hidden_act": "gelu", "hidden_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 0,
             "initializer_range": 0.02, "layer_norm_eps": 1e-7, "relative_attention": False,
             "max_relative_positions": -1, "pad_token_id": 0, "position_biased_input": True, "pos_att_type": None,
             "pooler_hidden_act": "gelu", "legacy": True, "tie_word_embeddings": True, "position_buckets": -1,
             "share_att_key": False, "norm_rel_ebd": "none", "conv_kernel_size": 0, "conv_act": "tanh",
             "conv_groups": 1}
_V1_SIZES = {"vocab_size": 50265, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072}
_V2_SIZES = {"vocab_size": 128100, "hidden_size": 1536, "num_hidden_layers": 24, "num_attention_heads": 24,
             "intermediate_size": 6144}


@dataclasses.dataclass(frozen=True)
class _Version:
    model_type: str
    prefix: str  # transformers class prefix
    sizes: dict
    v1: bool  # fused in_proj, no buckets / shared keys / conv / relative LayerNorm


def pos_att_terms(value) -> tuple[str, ...]:
    """`pos_att_type` as a list or as "p2c|c2p" (the string older config.json files carry)."""
    if value is None:
        return ()
    items = [item.strip().lower() for item in value.split("|")] if isinstance(value, str) else list(value)
    unknown = [item for item in items if item not in ("c2p", "p2c")]
    if unknown:
        raise ValueError(f"config.json: pos_att_type has unsupported term(s) {unknown} (bertjax has c2p and p2c)")
    return tuple(items)


def _to_encoder_config(version: _Version, values: dict, head: str) -> EncoderConfig:
    read = ConfigReader(values, {**_DEFAULTS, **version.sizes})
    if not read("relative_attention"):
        raise ValueError("config.json: relative_attention=false is not supported (bertjax's DeBERTa always has "
                         "disentangled attention)")
    read.expect("talking_head", (False,))
    read.expect("attention_head_size", (None,))
    hidden = read("hidden_size")
    pooler_size = values.get("pooler_hidden_size")
    if pooler_size is not None and pooler_size != hidden:
        raise ValueError(f"config.json: pooler_hidden_size={pooler_size} must equal hidden_size={hidden}")
    max_relative = read("max_relative_positions")
    if max_relative < 1:
        max_relative = read("max_position_embeddings")
    norm_rel = [item.strip() for item in str(read("norm_rel_ebd")).lower().split("|")]
    conv_act = read("conv_act")
    if conv_act not in HF_ACTIVATIONS:
        raise ValueError(f"config.json: unsupported activation conv_act={conv_act!r}")
    disentangled = DisentangledAttentionConfig(
        pos_att_type=pos_att_terms(read("pos_att_type")), max_relative_positions=max_relative,
        position_buckets=0 if version.v1 else max(read("position_buckets"), 0),
        share_att_key=False if version.v1 else bool(read("share_att_key")),
        norm_rel_ebd=not version.v1 and "layer_norm" in norm_rel,
        conv_kernel_size=0 if version.v1 else read("conv_kernel_size"), conv_act=HF_ACTIVATIONS[conv_act],
        conv_groups=1 if version.v1 else read("conv_groups"), fused_qkv=version.v1,
        legacy_mlm_head=bool(read("legacy")))
    activation = read.activation("hidden_act")
    embedding_size = values.get("embedding_size")
    return EncoderConfig(
        family=version.model_type,
        vocab_size=read("vocab_size"), hidden_size=hidden, num_layers=read("num_hidden_layers"),
        num_heads=read("num_attention_heads"), intermediate_size=read("intermediate_size"),
        embedding_size=None if embedding_size in (None, hidden) else embedding_size,
        max_position_embeddings=read("max_position_embeddings"), type_vocab_size=read("type_vocab_size"),
        position_embedding="learned" if read("position_biased_input") else "none", position_offset=0,
        norm="layernorm", norm_eps=read.number("layer_norm_eps"), norm_bias=True, norm_placement="post",
        embedding_norm=True, final_norm=False, attention_bias=True, mlp_bias=True, activation=activation, mlp="dense",
        global_attention_every=1, attention_kind="disentangled", disentangled=disentangled,
        tie_word_embeddings=read("tie_word_embeddings"), decoder_bias=True, head_dense_bias=True,
        head_activation=activation, mlm_head_transform=True, pooler=False,
        classifier_activation=read.activation("pooler_hidden_act"), pad_token_id=read("pad_token_id"),
        dropout_rate=read.number("hidden_dropout_prob"), initializer_range=read.number("initializer_range"))


def _to_hf_config(version: _Version, config: EncoderConfig, head: str) -> dict:
    cfg, dis = config, config.disentangled
    refuse = Refusals(cfg, version.model_type)
    refuse.common(factorised_embedding=True, attention_kind="disentangled")
    refuse.need(norm_bias=True, norm_placement="post", embedding_norm=True,
                final_norm=False, position_offset=0, attention_bias=True, mlp_bias=True, mlp="dense",
                global_attention_every=1, pooler=False, head_dense_bias=True, decoder_bias=True,
                head_activation=cfg.activation)
    refuse.check(cfg.position_embedding in ("learned", "none"),
                 f"position_embedding={cfg.position_embedding!r} (DeBERTa has learned absolute positions or none)")
    if dis is not None:
        refuse.check(dis.fused_qkv == version.v1, f"disentangled.fused_qkv={dis.fused_qkv} (v1's in_proj "
                     f"{'is' if version.v1 else 'is not'} the {version.model_type} layout)")
        if version.v1:
            refuse.check(dis.position_buckets == 0, "disentangled.position_buckets (v1 has no log buckets)")
            refuse.check(not dis.share_att_key, "disentangled.share_att_key (v1 has separate position projections)")
            refuse.check(not dis.norm_rel_ebd, "disentangled.norm_rel_ebd (v1 has no relative LayerNorm)")
            refuse.check(dis.conv_kernel_size == 0, "disentangled.conv_kernel_size (v1 has no convolution)")
        refuse.check(dis.conv_act in ACTIVATION_TO_HF, f"disentangled.conv_act={dis.conv_act!r} (no HF name)")
        if not dis.legacy_mlm_head:
            refuse.check(cfg.tie_word_embeddings and cfg.embed_dim == cfg.hidden_size,
                         "disentangled.legacy_mlm_head=False with an untied or factorised decoder (lm_predictions "
                         "multiplies by the word embeddings of hidden width)")
    refuse.raise_if_any()
    values = {
        "model_type": version.model_type, "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.intermediate_size, "hidden_act": ACTIVATION_TO_HF[cfg.activation],
        "hidden_dropout_prob": cfg.dropout_rate, "attention_probs_dropout_prob": 0.0,
        "max_position_embeddings": cfg.max_position_embeddings, "type_vocab_size": cfg.type_vocab_size,
        "initializer_range": cfg.initializer_range, "layer_norm_eps": cfg.norm_eps, "pad_token_id": cfg.pad_token_id,
        "tie_word_embeddings": cfg.tie_word_embeddings, "relative_attention": True,
        "max_relative_positions": dis.max_relative_positions, "pos_att_type": list(dis.pos_att_type),
        "position_biased_input": cfg.position_embedding == "learned", "pooler_hidden_size": cfg.hidden_size,
        "pooler_hidden_act": ACTIVATION_TO_HF[cfg.classifier_activation], "pooler_dropout": 0.0,
        "legacy": dis.legacy_mlm_head,
    }
    if cfg.embed_dim != cfg.hidden_size:
        values["embedding_size"] = cfg.embed_dim
    if not version.v1:
        values.update(position_buckets=dis.position_buckets if dis.position_buckets else -1,
                      share_att_key=dis.share_att_key, norm_rel_ebd="layer_norm" if dis.norm_rel_ebd else "none",
                      conv_kernel_size=dis.conv_kernel_size, conv_act=ACTIVATION_TO_HF[dis.conv_act],
                      conv_groups=dis.conv_groups)
    return values


def _fused_in_proj(heads: int, dim: int) -> Layout:
    """v1's in_proj [3 * heads * dim, hidden], rows [q_h, k_h, v_h] head by head <-> three [hidden, heads, dim]."""
    def load(w):
        w = w.reshape(heads, 3, dim, w.shape[1])
        return tuple(np.ascontiguousarray(w[:, i].transpose(2, 0, 1)) for i in range(3))

    def save(params):
        stacked = np.stack([p.transpose(1, 2, 0) for p in params], axis=1)  # [heads, 3, dim, hidden]
        return stacked.reshape(3 * heads * dim, stacked.shape[-1])

    return Layout(load=load, save=save)


CONV = Layout(load=lambda w: (w.transpose(2, 1, 0),), save=lambda p: p[0].transpose(2, 1, 0))


def _attention(version: _Version, key: str, path: ParamPath, cfg: EncoderConfig) -> list[TensorRule]:
    dis, heads, dim, h = cfg.disentangled, cfg.num_heads, cfg.head_dim, cfg.hidden_size
    a, p = f"{key}attention.self.", path + ("attention",)
    if version.v1:
        rules = [TensorRule((f"{a}in_proj.weight",), (3 * heads * dim, h),
                            (p + ("query", "kernel"), p + ("key", "kernel"), p + ("value", "kernel")),
                            _fused_in_proj(heads, dim)),
                 TensorRule((f"{a}q_bias",), (heads * dim,), (p + ("query_bias",),), heads_bias(heads, dim)),
                 TensorRule((f"{a}v_bias",), (heads * dim,), (p + ("value_bias",),), heads_bias(heads, dim))]
        if "c2p" in dis.pos_att_type:
            rules += attention_projection(f"{a}pos_proj", p + ("pos_key",), cfg, heads, bias=False)
        if "p2c" in dis.pos_att_type:
            rules += attention_projection(f"{a}pos_q_proj", p + ("pos_query",), cfg, heads)
        return rules
    rules = [*attention_projection(f"{a}query_proj", p + ("query",), cfg, heads),
             *attention_projection(f"{a}key_proj", p + ("key",), cfg, heads),
             *attention_projection(f"{a}value_proj", p + ("value",), cfg, heads)]
    if not dis.share_att_key:
        if "c2p" in dis.pos_att_type:
            rules += attention_projection(f"{a}pos_key_proj", p + ("pos_key",), cfg, heads)
        if "p2c" in dis.pos_att_type:
            rules += attention_projection(f"{a}pos_query_proj", p + ("pos_query",), cfg, heads)
    return rules


def _key_mapping(version: _Version, cfg: EncoderConfig, head: str) -> KeyMapping:
    """DebertaModel's tensors carry no prefix; inside the head classes the backbone is `deberta.`."""
    dis, e, h, i = cfg.disentangled, cfg.embed_dim, cfg.hidden_size, cfg.intermediate_size
    base = "" if head == "encoder" else "deberta."
    emb, enc = f"{base}embeddings.", f"{base}encoder."
    rules: list[TensorRule] = [
        *embedding(f"{emb}word_embeddings", ("embeddings", "word_embeddings"), cfg.vocab_size, e),
        *layer_norm(f"{emb}LayerNorm", ("embeddings", "norm"), h, bias=True),
        *embedding(f"{enc}rel_embeddings", ("encoder", "relative"), 2 * dis.span, h),
    ]
    if cfg.position_embedding == "learned":
        rules += embedding(f"{emb}position_embeddings", ("embeddings", "position_embeddings"),
                           cfg.max_position_embeddings, e)
    if cfg.type_vocab_size:
        rules += embedding(f"{emb}token_type_embeddings", ("embeddings", "token_type_embeddings"),
                           cfg.type_vocab_size, e)
    if e != h:
        rules += linear(f"{emb}embed_proj", ("embeddings", "projection"), e, h, bias=False)
    if dis.norm_rel_ebd:
        rules += layer_norm(f"{enc}LayerNorm", ("encoder", "relative", "norm"), h, bias=True)
    if dis.conv_kernel_size:
        rules += [TensorRule((f"{enc}conv.conv.weight",), (h, h // dis.conv_groups, dis.conv_kernel_size),
                             (("encoder", "conv", "kernel"),), CONV),
                  TensorRule((f"{enc}conv.conv.bias",), (h,), (("encoder", "conv", "bias"),),
                             Layout(load=lambda b: (b,), save=lambda p: p[0])),
                  *layer_norm(f"{enc}conv.LayerNorm", ("encoder", "conv", "norm"), h, bias=True)]
    for n in range(cfg.num_layers):
        key, path = f"{enc}layer.{n}.", ("encoder", f"layers_{n}")
        rules += [*_attention(version, key, path, cfg),
                  *attention_output(f"{key}attention.output.dense", path + ("attention", "out"), cfg),
                  *layer_norm(f"{key}attention.output.LayerNorm", path + ("attention_norm",), h, bias=True),
                  *linear(f"{key}intermediate.dense", path + ("mlp", "wi"), h, i, bias=True),
                  *linear(f"{key}output.dense", path + ("mlp", "wo"), i, h, bias=True),
                  *layer_norm(f"{key}output.LayerNorm", path + ("mlp_norm",), h, bias=True)]
    ignored = {f"{emb}position_ids"}  # a buffer older transformers versions saved
    if head == "masked_lm":
        if dis.legacy_mlm_head:
            p = "cls.predictions."
            rules += linear(f"{p}transform.dense", ("mlm_head", "dense"), h, e, bias=True)
            rules += layer_norm(f"{p}transform.LayerNorm", ("mlm_head", "norm"), e, bias=True)
            decoder_rules, decoder_ignored = mlm_decoder(f"{p}decoder", (f"{p}decoder.bias", f"{p}bias"), cfg)
            rules += decoder_rules
            ignored |= decoder_ignored
        else:
            p = "lm_predictions.lm_head."
            rules += linear(f"{p}dense", ("mlm_head", "dense"), h, h, bias=True)
            rules += layer_norm(f"{p}LayerNorm", ("mlm_head", "norm"), h, bias=True)
            rules.append(TensorRule((f"{p}bias",), (cfg.vocab_size,), (("mlm_head", "decoder_bias"),),
                                    Layout(load=lambda b: (b,), save=lambda q: q[0])))
    return KeyMapping(rules, frozenset(ignored))


def _family(version: _Version, task_heads: tuple[str, ...]) -> HfFamily:
    keys = bert_like_keys(HeadKeys(out="classifier", dense="pooler.dense"),
                          HeadKeys(out="classifier", dense="pooler.dense"))
    # ContextPooler: dense -> pooler_hidden_act (read with the encoder: activation_from_config) on the first token,
    # then `classifier`.
    heads = TaskHeads(base_prefix="deberta.", architectures=architectures(version.prefix, task_heads),
                      activation=None, activation_from_config=True, keys={name: keys[name] for name in task_heads},
                      dropout_key="cls_dropout")
    return HfFamily(
        model_type=version.model_type,
        architectures={f"{version.prefix}Model": "encoder", f"{version.prefix}ForMaskedLM": "masked_lm"},
        to_encoder_config=lambda values, head: _to_encoder_config(version, values, head),
        to_hf_config=lambda config, head: _to_hf_config(version, config, head),
        key_mapping=lambda config, head: _key_mapping(version, config, head),
        task_heads=heads,
    )


V1 = _Version("deberta", "Deberta", _V1_SIZES, v1=True)
V2 = _Version("deberta-v2", "DebertaV2", _V2_SIZES, v1=False)

_SINGLE = ("sequence_classification", "token_classification", "question_answering")
FAMILY_V1 = _family(V1, _SINGLE)  # transformers has no DebertaForMultipleChoice
FAMILY_V2 = _family(V2, (*_SINGLE, "multiple_choice"))
