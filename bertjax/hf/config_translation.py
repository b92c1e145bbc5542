"""Hugging Face `config.json` <-> `EncoderConfig`, one translator per family, registered by `model_type`.

Every architectural knob is read from the file; where a key is absent the value is the default of the matching
transformers config class, so a hand-trimmed config.json means what it means to transformers. Knobs that a
family cannot express are refused on export, listing every offending field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bertjax.config import EncoderConfig

# Hugging Face activation names -> EncoderConfig.activation, and back.
HF_ACTIVATIONS = {
    "gelu": "gelu",  # exact erf GELU
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
}
ACTIVATION_TO_HF = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu", "tanh": "tanh"}

# config.architectures[0] -> (model_type, head in bertjax.models.MODEL_CLASSES).
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "BertModel": ("bert", "encoder"),
    "BertForMaskedLM": ("bert", "masked_lm"),
    "BertForPreTraining": ("bert", "pretraining"),
    "RobertaModel": ("roberta", "encoder"),
    "RobertaForMaskedLM": ("roberta", "masked_lm"),
    "ModernBertModel": ("modernbert", "encoder"),
    "ModernBertForMaskedLM": ("modernbert", "masked_lm"),
}


def architecture_for(model_type: str, head: str) -> str:
    for name, target in ARCHITECTURES.items():
        if target == (model_type, head):
            return name
    raise ValueError(f"transformers has no {model_type} architecture for the bertjax head {head!r}; "
                     f"exportable: {sorted(ARCHITECTURES)}")


class _Reader:
    """Reads keys of one config.json with the transformers class defaults, naming the key on bad values."""

    def __init__(self, values: dict[str, Any], defaults: dict[str, Any]):
        self.values = values
        self.defaults = defaults

    def __call__(self, key: str) -> Any:
        if key in self.values and self.values[key] is not None:
            return self.values[key]
        if key in self.defaults:
            return self.defaults[key]
        raise ValueError(f"config.json: missing required key {key!r}")

    def activation(self, key: str) -> str:
        name = self(key)
        if name not in HF_ACTIVATIONS:
            raise ValueError(f"config.json: unsupported activation {key}={name!r}; supported: {sorted(HF_ACTIVATIONS)}")
        return HF_ACTIVATIONS[name]

    def expect(self, key: str, allowed: tuple) -> None:
        """Refuse keys that switch on behaviour bertjax does not implement (decoder mode, relative positions)."""
        value = self.values.get(key)
        if value is not None and value not in allowed:
            raise ValueError(f"config.json: {key}={value!r} is not supported (allowed: {list(allowed)})")


class _Problems:
    """Collects every knob of an EncoderConfig that an HF family cannot express, then raises once."""

    def __init__(self, config: EncoderConfig, family: str):
        self.config = config
        self.family = family
        self.items: list[str] = []

    def need(self, **expected) -> None:
        for field, value in expected.items():
            actual = getattr(self.config, field)
            if actual != value:
                self.items.append(f"{field}={actual!r} (needs {value!r})")

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.items.append(message)

    def common(self) -> None:
        cfg = self.config
        self.check(cfg.kv_heads == cfg.num_heads, f"num_kv_heads={cfg.num_kv_heads} (grouped-query attention)")
        self.check(cfg.embed_dim == cfg.hidden_size, f"embedding_size={cfg.embedding_size} (factorised embedding)")
        self.check(cfg.layer_groups == cfg.num_layers, f"num_layer_groups={cfg.num_layer_groups} (layer sharing)")
        self.need(norm="layernorm")
        if cfg.activation not in ACTIVATION_TO_HF:
            self.items.append(f"activation={cfg.activation!r}")

    def raise_if_any(self) -> None:
        if self.items:
            raise ValueError(f"this EncoderConfig cannot be written as a Hugging Face {self.family} checkpoint: "
                             + "; ".join(self.items))


# --------------------------------------------------------------------------------------------------------------
# BERT and RoBERTa: post-norm, learned absolute positions, biases everywhere. RoBERTa's positions start after the
# padding index and its MLM head always applies the exact GELU.

_BERT_DEFAULTS = {"hidden_act": "gelu", "hidden_dropout_prob": 0.1, "max_position_embeddings": 512,
                  "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
                  "tie_word_embeddings": True}
_ROBERTA_DEFAULTS = {**_BERT_DEFAULTS, "pad_token_id": 1}


@dataclasses.dataclass(frozen=True)
class BertFamily:
    model_type: str
    defaults: dict
    positions_after_padding: bool  # RoBERTa: position ids start at pad_token_id + 1
    head_follows_hidden_act: bool  # BERT's MLM transform uses hidden_act; RoBERTa's lm_head always exact GELU

    def to_encoder_config(self, values: dict, head: str) -> EncoderConfig:
        read = _Reader(values, self.defaults)
        read.expect("is_decoder", (False,))
        read.expect("add_cross_attention", (False,))
        read.expect("position_embedding_type", ("absolute",))
        activation = read.activation("hidden_act")
        pad = read("pad_token_id")
        return EncoderConfig(
            vocab_size=read("vocab_size"), hidden_size=read("hidden_size"), num_layers=read("num_hidden_layers"),
            num_heads=read("num_attention_heads"), intermediate_size=read("intermediate_size"),
            max_position_embeddings=read("max_position_embeddings"), type_vocab_size=read("type_vocab_size"),
            position_embedding="learned", position_offset=pad + 1 if self.positions_after_padding else 0,
            norm="layernorm", norm_eps=float(read("layer_norm_eps")), norm_bias=True, norm_placement="post",
            embedding_norm=True, final_norm=False, attention_bias=True, mlp_bias=True, activation=activation,
            mlp="dense", global_attention_every=1, tie_word_embeddings=read("tie_word_embeddings"),
            decoder_bias=True, head_dense_bias=True,
            head_activation=activation if self.head_follows_hidden_act else "gelu",
            # BertModel/RobertaModel carry the pooler; the MLM classes are built without it.
            pooler=head != "masked_lm", pad_token_id=pad,
            # bertjax has one dropout rate (no attention-probability dropout); dropout never changes inference.
            dropout_rate=float(read("hidden_dropout_prob")), initializer_range=float(read("initializer_range")))

    def to_hf_config(self, config: EncoderConfig, head: str) -> dict:
        problems = _Problems(config, self.model_type)
        problems.common()
        problems.need(position_embedding="learned", norm_bias=True, norm_placement="post", embedding_norm=True,
                      final_norm=False, attention_bias=True, mlp_bias=True, mlp="dense", global_attention_every=1,
                      head_dense_bias=True, decoder_bias=True)
        problems.need(position_offset=config.pad_token_id + 1 if self.positions_after_padding else 0)
        problems.need(head_activation=config.activation if self.head_follows_hidden_act else "gelu")
        problems.check(config.type_vocab_size >= 1, "type_vocab_size=0 (the family always has token types)")
        if head == "encoder":
            problems.check(config.pooler, f"pooler=False ({architecture_for(self.model_type, head)} has a pooler)")
        problems.raise_if_any()
        return {
            "model_type": self.model_type, "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
            "intermediate_size": config.intermediate_size, "hidden_act": ACTIVATION_TO_HF[config.activation],
            "hidden_dropout_prob": config.dropout_rate, "attention_probs_dropout_prob": 0.0,
            "max_position_embeddings": config.max_position_embeddings, "type_vocab_size": config.type_vocab_size,
            "initializer_range": config.initializer_range, "layer_norm_eps": config.norm_eps,
            "pad_token_id": config.pad_token_id, "tie_word_embeddings": config.tie_word_embeddings,
            "is_decoder": False, "add_cross_attention": False,
        }


# --------------------------------------------------------------------------------------------------------------
# ModernBERT: pre-norm, RoPE with a global and a local theta, GeGLU, alternating global/sliding-window layers.

_MODERNBERT_DEFAULTS = {
    "hidden_activation": "gelu", "max_position_embeddings": 8192, "initializer_range": 0.02, "norm_eps": 1e-5,
    "norm_bias": False, "pad_token_id": 50283, "attention_bias": False, "local_attention": 128, "mlp_bias": False,
    "decoder_bias": True, "classifier_bias": False, "classifier_activation": "gelu", "tie_word_embeddings": True,
    "embedding_dropout": 0.0, "attention_dropout": 0.0, "mlp_dropout": 0.0,
    # The legacy (transformers 4) keys and their defaults.
    "global_attn_every_n_layers": 3, "global_rope_theta": 160_000.0, "local_rope_theta": 10_000.0,
}
_LAYER_TYPES = ("full_attention", "sliding_attention")


def global_every_from_layer_types(layer_types: list, num_layers: int) -> int:
    """The n of "layer i is global iff i % n == 0" that reproduces `layer_types`, or a ValueError."""
    if not isinstance(layer_types, list) or len(layer_types) != num_layers:
        raise ValueError(f"config.json: layer_types must be a list of num_hidden_layers={num_layers} entries, "
                         f"got {layer_types!r}")
    unknown = sorted({t for t in layer_types if t not in _LAYER_TYPES})
    if unknown:
        raise ValueError(f"config.json: layer_types has unknown entries {unknown}; known: {list(_LAYER_TYPES)}")
    later_globals = [i for i, t in enumerate(layer_types) if i > 0 and t == "full_attention"]
    every = later_globals[0] if later_globals else num_layers
    pattern = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(num_layers)]
    if pattern != layer_types:
        raise ValueError(f"config.json: layer_types {layer_types} is not 'full attention every n layers "
                         "starting at layer 0', the only pattern bertjax expresses")
    return every


def _rope_thetas(read: _Reader, values: dict) -> tuple[float, float]:
    """(global, local) theta from `rope_parameters`, falling back to the legacy keys as transformers does."""
    if values.get("rope_scaling") is not None:
        raise ValueError(f"config.json: rope_scaling={values['rope_scaling']!r} is not supported")
    parameters = values.get("rope_parameters") or {}
    if not isinstance(parameters, dict):
        raise ValueError(f"config.json: rope_parameters must be a dict, got {parameters!r}")
    thetas = []
    for layer_type, legacy_key in (("full_attention", "global_rope_theta"), ("sliding_attention", "local_rope_theta")):
        entry = parameters.get(layer_type) or {}
        rope_type = entry.get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"config.json: rope_parameters.{layer_type}.rope_type={rope_type!r} is not supported "
                             "(only 'default' RoPE)")
        thetas.append(float(entry["rope_theta"]) if entry.get("rope_theta") is not None else float(read(legacy_key)))
    return thetas[0], thetas[1]


@dataclasses.dataclass(frozen=True)
class ModernBertFamily:
    model_type: str = "modernbert"
    defaults: dict = dataclasses.field(default_factory=lambda: dict(_MODERNBERT_DEFAULTS))

    def to_encoder_config(self, values: dict, head: str) -> EncoderConfig:
        read = _Reader(values, self.defaults)
        num_layers = read("num_hidden_layers")
        if values.get("layer_types") is not None:  # transformers 5 format
            every = global_every_from_layer_types(values["layer_types"], num_layers)
        else:  # transformers 4 format
            every = read("global_attn_every_n_layers")
        rope_global, rope_local = _rope_thetas(read, values)
        dropouts = [float(read(k)) for k in ("embedding_dropout", "attention_dropout", "mlp_dropout")]
        return EncoderConfig(
            vocab_size=read("vocab_size"), hidden_size=read("hidden_size"), num_layers=num_layers,
            num_heads=read("num_attention_heads"), intermediate_size=read("intermediate_size"),
            max_position_embeddings=read("max_position_embeddings"), type_vocab_size=0,
            position_embedding="rope", rope_theta_global=rope_global, rope_theta_local=rope_local,
            norm="layernorm", norm_eps=float(read("norm_eps")), norm_bias=read("norm_bias"),
            norm_placement="pre", embedding_norm=True, final_norm=True, first_layer_attention_norm=False,
            attention_bias=read("attention_bias"), mlp_bias=read("mlp_bias"),
            activation=read.activation("hidden_activation"), mlp="glu", global_attention_every=every,
            local_window=read("local_attention"), tie_word_embeddings=read("tie_word_embeddings"),
            decoder_bias=read("decoder_bias"), head_dense_bias=read("classifier_bias"),
            head_activation=read.activation("classifier_activation"), pooler=False,
            pad_token_id=read("pad_token_id"),
            # bertjax has one dropout rate where ModernBERT has three; dropout never changes inference.
            dropout_rate=max(dropouts), initializer_range=float(read("initializer_range")))

    def to_hf_config(self, config: EncoderConfig, head: str) -> dict:
        problems = _Problems(config, self.model_type)
        problems.common()
        problems.need(position_embedding="rope", norm_placement="pre", embedding_norm=True, final_norm=True,
                      first_layer_attention_norm=False, mlp="glu", type_vocab_size=0, position_offset=0)
        if config.head_activation not in ACTIVATION_TO_HF:
            problems.items.append(f"head_activation={config.head_activation!r}")
        if head == "encoder":
            problems.check(not config.pooler, "pooler=True (ModernBertModel has no pooler)")
        problems.raise_if_any()
        layer_types = ["full_attention" if config.is_global_layer(i) else "sliding_attention"
                       for i in range(config.num_layers)]
        return {
            "model_type": self.model_type, "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
            "intermediate_size": config.intermediate_size,
            "hidden_activation": ACTIVATION_TO_HF[config.activation],
            "max_position_embeddings": config.max_position_embeddings,
            "initializer_range": config.initializer_range, "norm_eps": config.norm_eps,
            "norm_bias": config.norm_bias, "attention_bias": config.attention_bias, "mlp_bias": config.mlp_bias,
            "layer_types": layer_types,
            # A model with only global layers never reads the window; transformers still wants an integer.
            "local_attention": config.local_window or self.defaults["local_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": config.rope_theta_global},
                "sliding_attention": {"rope_type": "default", "rope_theta": config.rope_theta_local},
            },
            "embedding_dropout": config.dropout_rate, "attention_dropout": 0.0, "mlp_dropout": config.dropout_rate,
            "decoder_bias": config.decoder_bias, "classifier_bias": config.head_dense_bias,
            "classifier_activation": ACTIVATION_TO_HF[config.head_activation],
            "tie_word_embeddings": config.tie_word_embeddings, "pad_token_id": config.pad_token_id,
            # The tokenizer owns the other special tokens; transformers' defaults would point outside small vocabs.
            "bos_token_id": None, "eos_token_id": None, "cls_token_id": None, "sep_token_id": None,
        }


# model_type -> translator.
TRANSLATORS: dict[str, BertFamily | ModernBertFamily] = {
    "bert": BertFamily("bert", _BERT_DEFAULTS, positions_after_padding=False, head_follows_hidden_act=True),
    "roberta": BertFamily("roberta", _ROBERTA_DEFAULTS, positions_after_padding=True, head_follows_hidden_act=False),
    "modernbert": ModernBertFamily(),
}


def translator(model_type: str):
    if model_type not in TRANSLATORS:
        raise ValueError(f"config.json: unknown model_type {model_type!r}; supported: {sorted(TRANSLATORS)}")
    return TRANSLATORS[model_type]


def hf_config_for(config: EncoderConfig, head: str) -> dict:
    """The config.json of the one family that can express `config` (each family refuses the others' knobs)."""
    reasons = []
    for model_type, family in TRANSLATORS.items():
        try:
            values = family.to_hf_config(config, head)
            architecture = architecture_for(model_type, head)
        except ValueError as error:
            reasons.append(f"{model_type}: {error}")
            continue
        return {"architectures": [architecture], **values}
    raise ValueError("no Hugging Face family can express this model:\n  " + "\n  ".join(reasons))
