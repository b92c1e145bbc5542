"""What every Hugging Face family's config translation shares: activation names, reading a config.json with the
transformers class defaults, and collecting refusals on export.

Each family module (`bertjax/hf/bert.py`, ...) reads its own keys with a `ConfigReader` and refuses what it
cannot express with `Refusals`, so a user sees every offending field at once, named as in `EncoderConfig`.
"""

from __future__ import annotations

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


class ConfigReader:
    """Reads keys of one config.json with the transformers class defaults, naming the key on bad values."""

    def __init__(self, values: dict[str, Any], defaults: dict[str, Any]):
        self.values = values
        self.defaults = defaults

    def __call__(self, key: str, *aliases: str) -> Any:
        """The value of `key`, else of the first alias present (older layouts), else the class default.

        Aliases are the names transformers' `attribute_map` maps onto `key` (DistilBERT's `dim` is also read as
        `hidden_size`), so a config.json written with either name means the same model.
        """
        for name in (key, *aliases):
            if name in self.values and self.values[name] is not None:
                return self.values[name]
        if key in self.defaults:
            return self.defaults[key]
        raise ValueError(f"config.json: missing required key {key!r}")

    def number(self, key: str, *aliases: str) -> float:
        """A float key (eps, dropout, range): a JSON number, else an error naming the key (float() of a list raised
        a bare TypeError, and of a string took "1e-12" that transformers' layers would not)."""
        value = self(key, *aliases)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"config.json: {key} must be a number, got {type(value).__name__} {value!r}")
        return float(value)

    def activation(self, key: str) -> str:
        name = self(key)
        if not isinstance(name, str) or name not in HF_ACTIVATIONS:
            raise ValueError(f"config.json: unsupported activation {key}={name!r}; supported: {sorted(HF_ACTIVATIONS)}")
        return HF_ACTIVATIONS[name]

    def expect(self, key: str, allowed: tuple) -> None:
        """Refuse keys that switch on behaviour bertjax does not implement (decoder mode, relative positions)."""
        value = self.values.get(key)
        if value is not None and value not in allowed:
            raise ValueError(f"config.json: {key}={value!r} is not supported (allowed: {list(allowed)})")


class Refusals:
    """Collects every knob of an EncoderConfig that one HF family cannot express, then raises once."""

    def __init__(self, config: EncoderConfig, model_type: str, *, split_mlp_bias: bool = False):
        """`split_mlp_bias`: the family has an up-projection bias setting of its own (MosaicBERT); every other one
        has one bias setting for the whole feed-forward block."""
        self.config = config
        self.model_type = model_type
        self.items: list[str] = []
        self.need(family=model_type)
        if not split_mlp_bias:
            self.check(config.mlp_up_bias in (None, config.mlp_bias),
                       f"mlp_up_bias={config.mlp_up_bias!r} (the family's feed-forward projections share mlp_bias)")

    def need(self, **expected) -> None:
        for field, value in expected.items():
            actual = getattr(self.config, field)
            if actual != value:
                self.items.append(f"{field}={actual!r} (needs {value!r})")

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.items.append(message)

    def exportable_activation(self, field: str) -> None:
        value = getattr(self.config, field)
        self.check(value in ACTIVATION_TO_HF, f"{field}={value!r} (no Hugging Face name)")

    def common(self, *, factorised_embedding: bool = False, layer_sharing: bool = False,
               attention_kind: str = "standard") -> None:
        """Knobs most families lack: GQA, RMSNorm, an explicit head width, an MLM head without its transform, and
        (unless the family has them) E != H and shared layers; and another family's attention module."""
        cfg = self.config
        self.need(attention_kind=attention_kind)
        self.check(cfg.kv_heads == cfg.num_heads, f"num_kv_heads={cfg.num_kv_heads} (grouped-query attention)")
        if not factorised_embedding:
            self.check(cfg.embed_dim == cfg.hidden_size, f"embedding_size={cfg.embedding_size} (factorised embedding)")
        if not layer_sharing:
            self.check(cfg.layer_groups == cfg.num_layers, f"num_layer_groups={cfg.num_layer_groups} (layer sharing)")
            self.need(layers_per_group=1)
        self.need(norm="layernorm")
        self.exportable_activation("activation")
        # Only EuroBERT's config has a head width of its own and an MLM head without the dense/norm transform.
        self.check(cfg.attention_head_dim in (None, cfg.hidden_size // cfg.num_heads),
                   f"attention_head_dim={cfg.attention_head_dim} (heads are hidden_size // num_heads wide)")
        self.need(mlm_head_transform=True)

    def raise_if_any(self) -> None:
        if self.items:
            # A model directory written before EncoderConfig.family existed reads back as the default 'bert';
            # saying which field picked the family points at the fix.
            raise ValueError(f"this EncoderConfig cannot be written as a Hugging Face {self.model_type} checkpoint "
                             f"(the family EncoderConfig.family={self.config.family!r} names): "
                             + "; ".join(self.items))
