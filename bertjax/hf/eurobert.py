"""EuroBERT checkpoints: EuroBertModel and EuroBertForMaskedLM.

EuroBERT is a Llama-shaped bidirectional encoder: RMSNorm before attention and MLP, a final RMSNorm, no embedding
norm, SwiGLU (`gate_proj` activated, `up_proj` linear), RoPE, grouped-query attention whose `head_dim` need not
be hidden_size / num_heads, and an LM head that is one linear layer (bias only when `mlp_bias`) on the final-norm
output, untied from the embeddings unless `tie_word_embeddings` says otherwise.

Two config layouts exist: transformers 5 writes `rope_parameters: {rope_type, rope_theta}`; the published
checkpoints (written by transformers 4 / the EuroBERT remote code) carry a top-level `rope_theta` and
`rope_scaling: null`. Both are read; only default (unscaled) RoPE is accepted.
"""

from __future__ import annotations

from bertjax.config import FAMILY_POOLING, EncoderConfig
from bertjax.hf.config_common import ACTIVATION_TO_HF, ConfigReader, Refusals
from bertjax.hf.family import HfFamily
from bertjax.hf.task_heads import HeadKeys, TaskHeads, architectures
from bertjax.hf.mapping import (KeyMapping, ParamPath, TensorRule, attention_output, attention_projection, embedding,
                                layer_norm, linear, mlm_decoder)

MODEL_TYPE = "eurobert"

# transformers' EuroBertConfig defaults (EuroBERT-210m's sizes), so a trimmed config.json means the same.
DEFAULTS = {"vocab_size": 128256, "hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
            "num_attention_heads": 12, "hidden_act": "silu", "max_position_embeddings": 8192,
            "initializer_range": 0.02, "rms_norm_eps": 1e-5, "pad_token_id": 128001, "tie_word_embeddings": False,
            "attention_bias": False, "mlp_bias": False, "rope_theta": 10_000.0}


def rope_theta(read: ConfigReader, values: dict) -> float:
    """The RoPE base from `rope_parameters` (transformers 5) or the legacy top-level `rope_theta`."""
    scaling = values.get("rope_scaling")
    if scaling is not None and (not isinstance(scaling, dict) or scaling.get("rope_type", scaling.get("type"))
                                not in (None, "default")):
        raise ValueError(f"config.json: rope_scaling={scaling!r} is not supported (only default RoPE)")
    parameters = values.get("rope_parameters")
    if parameters is None:
        return read.number("rope_theta")
    if not isinstance(parameters, dict):
        raise ValueError(f"config.json: rope_parameters must be a dict, got {parameters!r}")
    if parameters.get("rope_type", "default") != "default":
        raise ValueError(f"config.json: rope_parameters.rope_type={parameters['rope_type']!r} is not supported "
                         "(only 'default' RoPE)")
    return float(parameters["rope_theta"]) if parameters.get("rope_theta") is not None else read.number("rope_theta")


def to_encoder_config(values: dict, head: str) -> EncoderConfig:
    del head  # every EuroBERT class has the same backbone
    read = ConfigReader(values, DEFAULTS)
    hidden, heads = read("hidden_size"), read("num_attention_heads")
    head_dim, kv_heads = values.get("head_dim"), values.get("num_key_value_heads")
    theta = rope_theta(read, values)
    mlp_bias = read("mlp_bias")
    return EncoderConfig(
        family=MODEL_TYPE,
        vocab_size=read("vocab_size"), hidden_size=hidden, num_layers=read("num_hidden_layers"), num_heads=heads,
        num_kv_heads=kv_heads if kv_heads not in (None, heads) else None, intermediate_size=read("intermediate_size"),
        # GQA and the head width are stored only where they differ from the defaults, so equal configs compare equal.
        attention_head_dim=head_dim if head_dim not in (None, hidden // heads) else None,
        max_position_embeddings=read("max_position_embeddings"), type_vocab_size=0, position_embedding="rope",
        rope_theta_global=theta, rope_theta_local=theta, norm="rmsnorm", norm_eps=read.number("rms_norm_eps"),
        norm_bias=False, norm_placement="pre", embedding_norm=False, final_norm=True,
        attention_bias=read("attention_bias"), mlp_bias=mlp_bias, activation=read.activation("hidden_act"),
        mlp="glu", global_attention_every=1, tie_word_embeddings=read("tie_word_embeddings"),
        decoder_bias=mlp_bias, mlm_head_transform=False, pooler=False, pad_token_id=read("pad_token_id"),
        # EuroBERT has no residual dropout (only an attention-probability dropout, 0 in the published configs).
        dropout_rate=0.0, initializer_range=read.number("initializer_range"))


def to_hf_config(config: EncoderConfig, head: str) -> dict:
    del head
    cfg = config
    refuse = Refusals(cfg, MODEL_TYPE)
    refuse.check(cfg.embed_dim == cfg.hidden_size, f"embedding_size={cfg.embedding_size} (factorised embedding)")
    refuse.check(cfg.layer_groups == cfg.num_layers, f"num_layer_groups={cfg.num_layer_groups} (layer sharing)")
    refuse.check(cfg.rope_theta_local == cfg.rope_theta_global,
                 f"rope_theta_local={cfg.rope_theta_local} (EuroBERT has one theta: {cfg.rope_theta_global})")
    refuse.exportable_activation("activation")
    refuse.check(cfg.hidden_size % cfg.num_heads == 0,
                 f"hidden_size={cfg.hidden_size} not divisible by num_heads={cfg.num_heads} (transformers' "
                 "EuroBertConfig refuses it)")
    refuse.need(attention_kind="standard", norm="rmsnorm", norm_placement="pre", embedding_norm=False, final_norm=True,
                first_layer_attention_norm=True, position_embedding="rope", type_vocab_size=0, position_offset=0,
                mlp="glu", global_attention_every=1, pooler=False, mlm_head_transform=False,
                decoder_bias=cfg.mlp_bias, layers_per_group=1)
    refuse.raise_if_any()
    return {
        "model_type": MODEL_TYPE, "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim,
        "hidden_act": ACTIVATION_TO_HF[cfg.activation], "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range, "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta_global},
        "attention_bias": cfg.attention_bias, "attention_dropout": 0.0, "mlp_bias": cfg.mlp_bias,
        "tie_word_embeddings": cfg.tie_word_embeddings, "pad_token_id": cfg.pad_token_id,
        # The tokenizer owns the other special tokens; transformers' defaults would point outside small vocabs.
        # (mask_token_id must be an integer for transformers and is left at its default: the model never reads it.)
        "bos_token_id": None, "eos_token_id": None,
    }


def _layer(key: str, path: ParamPath, cfg: EncoderConfig) -> list[TensorRule]:
    h, i = cfg.hidden_size, cfg.intermediate_size
    attention = path + ("attention",)
    rules = [
        *attention_projection(f"{key}self_attn.q_proj", attention + ("query",), cfg, cfg.num_heads),
        *attention_projection(f"{key}self_attn.k_proj", attention + ("key",), cfg, cfg.kv_heads),
        *attention_projection(f"{key}self_attn.v_proj", attention + ("value",), cfg, cfg.kv_heads),
        *attention_output(f"{key}self_attn.o_proj", attention + ("out",), cfg),
    ]
    rules += layer_norm(f"{key}input_layernorm", path + ("attention_norm",), h, bias=False)
    rules += layer_norm(f"{key}post_attention_layernorm", path + ("mlp_norm",), h, bias=False)
    rules += linear(f"{key}mlp.gate_proj", path + ("mlp", "wi_0"), h, i, cfg.mlp_bias)  # activated
    rules += linear(f"{key}mlp.up_proj", path + ("mlp", "wi_1"), h, i, cfg.mlp_bias)  # linear gate
    rules += linear(f"{key}mlp.down_proj", path + ("mlp", "wo"), i, h, cfg.mlp_bias)
    return rules


def key_mapping(cfg: EncoderConfig, head: str) -> KeyMapping:
    """EuroBertModel's tensors carry no prefix; inside EuroBertForMaskedLM the backbone is `model.`."""
    h = cfg.hidden_size
    base = "" if head == "encoder" else "model."
    rules = embedding(f"{base}embed_tokens", ("embeddings", "word_embeddings"), cfg.vocab_size, h)
    for i in range(cfg.num_layers):
        rules += _layer(f"{base}layers.{i}.", ("encoder", f"layers_{i}"), cfg)
    rules += layer_norm(f"{base}norm", ("encoder", "final_norm"), h, bias=False)
    ignored: set[str] = set()
    if head == "masked_lm":  # lm_head's bias exists only with mlp_bias (= decoder_bias)
        decoder_rules, ignored = mlm_decoder("lm_head", ("lm_head.bias",), cfg)
        rules += decoder_rules
    return KeyMapping(rules, frozenset(ignored))


# transformers has EuroBERT sequence and token classification only; "bos" pooling is bertjax's "cls".
_TASK_HEADS = TaskHeads(
    base_prefix="model.", architectures=architectures("EuroBert", ("sequence_classification", "token_classification")),
    activation="gelu", keys={"sequence_classification": HeadKeys(out="classifier", dense="dense"),
                             "token_classification": HeadKeys(out="classifier")},
    dropout_key=None, poolings={"cls": "bos", "mean": "mean", "late": "late"},
    pooling_default=FAMILY_POOLING[MODEL_TYPE])

FAMILY = HfFamily(
    model_type=MODEL_TYPE,
    architectures={"EuroBertModel": "encoder", "EuroBertForMaskedLM": "masked_lm"},
    to_encoder_config=to_encoder_config,
    to_hf_config=to_hf_config,
    key_mapping=key_mapping,
    task_heads=_TASK_HEADS,
)
