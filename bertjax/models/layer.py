"""One encoder layer in either norm placement.

post-norm (BERT family):  x = norm(x + attn(x));  x = norm(x + mlp(x))
pre-norm (ModernBERT, EuroBERT):  x = x + attn(norm(x));  x = x + mlp(norm(x))
The two norms are named `attention_norm` and `mlp_norm` in both placements.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from bertjax.config import EncoderConfig
from bertjax.models.attention import attention_module
from bertjax.models.common import norm
from bertjax.models.inputs import EncoderInputs
from bertjax.models.mlp import Mlp


class EncoderLayer(nn.Module):
    config: EncoderConfig
    local_window: int | None
    rope_theta: float
    has_attention_norm: bool = True  # False for ModernBERT's layer 0, whose input is already the embedding norm
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, inputs: EncoderInputs) -> jax.Array:
        cfg = self.config
        attention = attention_module(cfg)(cfg, self.local_window, self.rope_theta, name="attention")
        mlp = Mlp(cfg, name="mlp")
        drop = lambda h: nn.Dropout(cfg.dropout_rate)(h, deterministic=self.deterministic)
        if cfg.norm_placement == "pre":
            h = norm(cfg, "attention_norm")(x) if self.has_attention_norm else x
            x = x + drop(attention(h, inputs))
            x = x + drop(mlp(norm(cfg, "mlp_norm")(x)))
        else:
            x = norm(cfg, "attention_norm")(x + drop(attention(x, inputs)))
            x = norm(cfg, "mlp_norm")(x + drop(mlp(x)))
        return nn.with_logical_constraint(x, ("activation_batch", "activation_length", "activation_embed"))
