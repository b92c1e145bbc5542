"""Feed-forward block: plain (BERT) or gated (GeGLU for ModernBERT/MosaicBERT, SwiGLU for EuroBERT)."""

from __future__ import annotations

import flax.linen as nn
import jax

from bertjax.config import EncoderConfig
from bertjax.models.common import ACTIVATIONS, compute_dtype, dense, dense_weights, project
from bertjax.ops.glu import glu


class Mlp(nn.Module):
    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        act = ACTIVATIONS[cfg.activation]
        up = lambda name: dense_weights(cfg, x.shape[-1], cfg.intermediate_size, ("embed", "mlp"),
                                        use_bias=cfg.up_bias, name=name)()
        if cfg.mlp == "glu":  # wi_0 activated, wi_1 the linear gate: one stacked [..., 2, intermediate] projection
            stacked = project(x, [up("wi_0"), up("wi_1")], 1, compute_dtype(cfg), stacked=True)
            h = glu(stacked, cfg.activation, implementation=cfg.glu_implementation, interpret=cfg.glu_interpret)
        else:
            h = act(dense(cfg, cfg.intermediate_size, ("embed", "mlp"), use_bias=cfg.up_bias, name="wi")(x))
        h = nn.with_logical_constraint(h, ("activation_batch", "activation_length", "activation_mlp"))
        return dense(cfg, cfg.hidden_size, ("mlp", "embed"), use_bias=cfg.mlp_bias, name="wo")(h)
