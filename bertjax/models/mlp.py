"""Feed-forward block: plain (BERT) or gated (GeGLU for ModernBERT/MosaicBERT, SwiGLU for EuroBERT)."""

from __future__ import annotations

import flax.linen as nn
import jax

from bertjax.config import EncoderConfig
from bertjax.models.common import ACTIVATIONS, dense


class Mlp(nn.Module):
    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        act = ACTIVATIONS[cfg.activation]
        up = lambda name: dense(cfg, cfg.intermediate_size, ("embed", "mlp"), use_bias=cfg.mlp_bias, name=name)
        if cfg.mlp == "glu":
            h = act(up("wi_0")(x)) * up("wi_1")(x)  # wi_0 is activated, wi_1 is the linear gate
        else:
            h = act(up("wi")(x))
        h = nn.with_logical_constraint(h, ("activation_batch", "activation_length", "activation_mlp"))
        return dense(cfg, cfg.hidden_size, ("mlp", "embed"), use_bias=cfg.mlp_bias, name="wo")(h)
