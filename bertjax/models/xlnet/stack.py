"""XLNet's layer stack: the two streams through post-norm layers that share every parameter between them.

    layer:  x = norm(x + attention(x));  x = norm(x + mlp(x))     for x in (h, g), keys and values from h

Inputs besides the usual ones (transformers' meaning):
- `perm_mask` [batch, seq, seq]: 1 = token i may not attend to token j (the factorisation order); the content
  stream always sees its own token, the query stream only where perm_mask allows.
- `target_mapping` [batch, num_predict, seq]: slot m predicts position j where 1. With it the stack runs the query
  stream and returns its output [batch, num_predict, hidden]; without, the content stream's [batch, seq, hidden].
Packed rows (segment ids 1, 2, ...) attend within their own document; relative distances need no offsets.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from bertjax.config import EncoderConfig
from bertjax.models.attention import attention_module
from bertjax.models.checked import checking_traced_values
from bertjax.models.common import kernel_init, norm, param_dtype
from bertjax.models.encoder import REMAT_POLICIES
from bertjax.models.inputs import EncoderInputs
from bertjax.models.mlp import Mlp
from bertjax.models.xlnet.attention import StreamContext, relative_encoding

_ACTIVATION_AXES = ("activation_batch", "activation_length", "activation_embed")


class XLNetLayer(nn.Module):
    config: EncoderConfig
    deterministic: bool = True

    @nn.compact
    def __call__(self, h: jax.Array, g: jax.Array | None, context: StreamContext):
        cfg = self.config
        attention = attention_module(cfg)(cfg, name="attention")
        attention_norm, mlp, mlp_norm = norm(cfg, "attention_norm"), Mlp(cfg, name="mlp"), norm(cfg, "mlp_norm")
        drop = lambda x: nn.Dropout(cfg.dropout_rate)(x, deterministic=self.deterministic)
        h_att, g_att = attention(h, g, context, self.deterministic)

        def finish(x, att):
            x = attention_norm(x + drop(att))
            return nn.with_logical_constraint(mlp_norm(x + drop(mlp(x))), _ACTIVATION_AXES)

        return finish(h, h_att), None if g is None else finish(g, g_att)


def check_stream_inputs(inputs: EncoderInputs, perm_mask, target_mapping) -> None:
    """Shapes always; that no prediction slot selects a padding position with concrete values, and on the device
    inside `bertjax.checked` (under a plain jit the values are not known while tracing)."""
    batch, seq = inputs.input_ids.shape
    if perm_mask is not None and jnp.shape(perm_mask) != (batch, seq, seq):
        raise ValueError(f"perm_mask must be [batch, seq, seq] = {(batch, seq, seq)}, got {jnp.shape(perm_mask)}")
    if target_mapping is None:
        return
    shape = jnp.shape(target_mapping)
    if len(shape) != 3 or shape[0] != batch or shape[2] != seq:
        raise ValueError(f"target_mapping must be [batch, num_predict, seq] = ({batch}, num_predict, {seq}), got "
                         f"{shape}")
    if isinstance(target_mapping, jax.core.Tracer) or isinstance(inputs.segment_ids, jax.core.Tracer):
        if checking_traced_values():  # inside bertjax.checked: the same check, on the device
            bad = (jnp.asarray(target_mapping) != 0) & (inputs.segment_ids == 0)[:, None, :]
            checkify.check(~jnp.any(bad), "target_mapping selects padding: {} (row, prediction slot) entries point "
                           "at positions where attention_mask/segment_ids say padding", jnp.sum(bad))
        return
    selected = np.asarray(target_mapping) != 0
    padding = np.asarray(inputs.segment_ids) == 0
    rows, slots, positions = np.nonzero(selected & padding[:, None, :])
    if rows.size:
        raise ValueError(f"target_mapping selects padding: row {rows[0]}, prediction slot {slots[0]} points at "
                         f"position {positions[0]}, where attention_mask/segment_ids say padding "
                         f"({rows.size} such entries)")


def stream_context(cfg: EncoderConfig, inputs: EncoderInputs, perm_mask, target_mapping) -> StreamContext:
    segments = inputs.segment_ids
    # Same packed document and not padding; perm_mask then removes what the factorisation order hides.
    allowed = (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] != 0)
    if perm_mask is not None:
        allowed &= jnp.asarray(perm_mask) <= 0
    seq = segments.shape[1]
    types = inputs.token_type_ids if inputs.token_type_ids is not None else jnp.zeros_like(segments)
    return StreamContext(
        relative_encoding=relative_encoding(seq, cfg.hidden_size, cfg.xlnet.clamp_len),
        segment_differs=types[:, :, None] != types[:, None, :],
        content_allowed=allowed | jnp.eye(seq, dtype=bool)[None],
        query_allowed=allowed,
        target_mapping=None if target_mapping is None else jnp.asarray(target_mapping))


class XLNetStack(nn.Module):
    """The stack for attention_kind "two_stream" (bertjax.models.model.STACKS). Parameters: `mask_emb` (the query
    stream's start, transformers' mask_emb) and layers_0 ... layers_{L-1}."""

    config: EncoderConfig
    remat_policy: str = "none"

    @nn.compact
    def __call__(self, x: jax.Array, inputs: EncoderInputs, deterministic: bool = True, perm_mask=None,
                 target_mapping=None) -> jax.Array:
        cfg = self.config
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"unknown remat_policy {self.remat_policy!r}; known: {sorted(REMAT_POLICIES)}")
        check_stream_inputs(inputs, perm_mask, target_mapping)
        layer_cls = XLNetLayer
        if self.remat_policy != "none":
            layer_cls = nn.remat(XLNetLayer, policy=REMAT_POLICIES[self.remat_policy], prevent_cse=True)
        drop = lambda y: nn.Dropout(cfg.dropout_rate)(y, deterministic=deterministic)
        context = stream_context(cfg, inputs, perm_mask, target_mapping)
        context = context.replace(relative_encoding=drop(context.relative_encoding))
        mask_emb = self.param("mask_emb", kernel_init(cfg, ("embed",)), (cfg.hidden_size,), param_dtype(cfg))
        h, g = x, None
        if target_mapping is not None:
            num_predict = jnp.shape(target_mapping)[1]
            g = drop(jnp.broadcast_to(mask_emb.astype(x.dtype), (x.shape[0], num_predict, cfg.hidden_size)))
        # As EncoderStack records them (free unless "intermediates" is mutable): the content stream's input and each
        # layer's output, the last being last_hidden_state without target_mapping; with it, the query stream's too,
        # its last entry being last_hidden_state (transformers' hidden_states interleave both streams then).
        self.sow("intermediates", "hidden_states", h)
        if g is not None:
            self.sow("intermediates", "query_hidden_states", g)
        for i in range(cfg.num_layers):
            h, g = layer_cls(cfg, deterministic, name=f"layers_{i}")(h, g, context)
            self.sow("intermediates", "hidden_states", h)
            if g is not None:
                self.sow("intermediates", "query_hidden_states", g)
        return drop(h if g is None else g)
