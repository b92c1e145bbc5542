"""The layer stack: per-layer attention pattern, optional ALBERT-style parameter sharing, optional remat."""

from __future__ import annotations

import flax.linen as nn
import jax

from bertjax.config import EncoderConfig
from bertjax.models.common import norm
from bertjax.models.inputs import EncoderInputs
from bertjax.models.layer import EncoderLayer

# Rematerialisation policies by name (the run config picks one). "none" keeps every activation.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


class EncoderStack(nn.Module):
    config: EncoderConfig
    remat_policy: str = "none"

    @nn.compact
    def __call__(self, x: jax.Array, inputs: EncoderInputs, deterministic: bool = True) -> jax.Array:
        cfg = self.config
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"unknown remat_policy {self.remat_policy!r}; known: {sorted(REMAT_POLICIES)}")
        layer_cls = EncoderLayer
        if self.remat_policy != "none":
            layer_cls = nn.remat(EncoderLayer, policy=REMAT_POLICIES[self.remat_policy], prevent_cse=True)
        # With sharing (ALBERT) the config guarantees every layer of a group has the same window and theta,
        # so one module per group is called for each of its layers.
        groups = []
        for g in range(cfg.layer_groups):
            first = -(-g * cfg.num_layers // cfg.layer_groups)  # first layer i with i * groups // layers == g
            skip_norm = first == 0 and cfg.norm_placement == "pre" and not cfg.first_layer_attention_norm
            groups.append(layer_cls(cfg, cfg.layer_window(first), cfg.layer_rope_theta(first),
                                    has_attention_norm=not skip_norm, deterministic=deterministic,
                                    name=f"layers_{g}"))
        for i in range(cfg.num_layers):
            x = groups[i * cfg.layer_groups // cfg.num_layers](x, inputs)
        if cfg.final_norm:
            x = norm(cfg, "final_norm")(x)
        return x
