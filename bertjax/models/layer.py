"""One encoder layer in either norm placement.

post-norm (BERT family):  x = norm(x + attn(x));  x = norm(x + mlp(x))
pre-norm (ModernBERT, EuroBERT):  x = x + attn(norm(x));  x = x + mlp(norm(x))
The two norms are named `attention_norm` and `mlp_norm` in both placements.

Each residual add runs inside the norm that follows it (`Norm(x, delta, return_sum=True)`), so a kernel that does
both (norm_implementation "pallas_gpu") reads and writes the stream once. In the pre-norm placement the norm after
the MLP's add is the next layer's attention norm (or the final norm), so a layer returns its MLP output unadded, as
`pending`, and the next one adds it: the stream is always x + pending.
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
    def __call__(self, x: jax.Array, inputs: EncoderInputs,
                 pending: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
        """(x, pending) in, (x, pending) out: the residual stream is x + pending (pending None: x alone)."""
        cfg = self.config
        attention = attention_module(cfg)(cfg, self.local_window, self.rope_theta, name="attention")
        mlp = Mlp(cfg, name="mlp")
        drop = lambda h: nn.Dropout(cfg.dropout_rate)(h, deterministic=self.deterministic)
        if cfg.norm_placement == "pre":
            if self.has_attention_norm:
                x, h = norm(cfg, "attention_norm")(x, pending, return_sum=True)
            else:
                x = h = x if pending is None else x + pending
            x, h = norm(cfg, "mlp_norm")(x, drop(attention(h, inputs)), return_sum=True)
            pending = drop(mlp(h))
        else:
            x = x if pending is None else x + pending
            _, x = norm(cfg, "attention_norm")(x, drop(attention(x, inputs)), return_sum=True)
            _, x = norm(cfg, "mlp_norm")(x, drop(mlp(x)), return_sum=True)
            pending = None
        constrain = lambda a: nn.with_logical_constraint(
            a, ("activation_batch", "activation_length", "activation_embed"))
        return constrain(x), None if pending is None else constrain(pending)
