"""XLNet's relative attention, shared by the content and the query stream of one layer.

score(i, j) = [(q_i + content_bias) . k_j  +  (q_i + position_bias) . r_{i-j}  +  (q_i + segment_bias) . s_ij]
              / sqrt(head_dim)

r_{i-j}: the relative-position encoding projected per head (`relative`); s_ij: one of two learned vectors, for
"same token type" or not. Keys and values always come from the content stream. Parameters follow transformers'
XLNetRelativeAttention (q, k, v, r, o without biases; r_w_bias, r_r_bias, r_s_bias, seg_embed).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from bertjax.config import EncoderConfig
from bertjax.models.common import dense, kernel_init, param_dtype

# Added to disallowed scores: transformers subtracts 1e30, which in float32 rounds every masked score to exactly
# this value, so rows with nothing to attend to (padding) become the same uniform average.
MASKED_SCORE = -1e30


@struct.dataclass
class StreamContext:
    """What every layer's attention reads besides the streams, built once per forward (bertjax.models.xlnet.stack).
    """

    relative_encoding: jax.Array  # [2 * seq, hidden]: distances seq, seq - 1, ..., 1 - seq
    segment_differs: jax.Array  # [batch, seq, seq] bool: token types of i and j differ
    content_allowed: jax.Array  # [batch, seq, seq] bool: h_i may read h_j (always itself)
    query_allowed: jax.Array  # [batch, seq, seq] bool: g_i may read h_j (itself only if perm_mask allows)
    target_mapping: jax.Array | None  # [batch, num_predict, seq]: slot m predicts position j


def relative_encoding(seq: int, dim: int, clamp_len: int) -> jax.Array:
    """Sinusoidal encodings [2 * seq, dim] of the distances seq, seq - 1, ..., 1 - seq: sin features, then cos."""
    inv_freq = 1.0 / jnp.power(10000.0, jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    distance = jnp.arange(seq, -seq, -1, dtype=jnp.float32)
    if clamp_len > 0:
        distance = jnp.clip(distance, -clamp_len, clamp_len)
    angles = distance[:, None] * inv_freq[None, :]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def shift_relative(scores: jax.Array) -> jax.Array:
    """[batch, heads, seq, 2 * seq] scores against encodings of distances seq .. 1 - seq -> [batch, heads, seq,
    seq] where (i, j) holds the score of distance i - j (column seq - i + j). Transformer-XL's reshape trick:
    only reshapes and a slice, no gather."""
    b, n, q, p = scores.shape
    shifted = scores.reshape(b, n, p, q)[:, :, 1:, :].reshape(b, n, q, p - 1)
    return shifted[..., :q]


class RelativeAttention(nn.Module):
    """One layer's attention for both streams. Constructor as every module of ATTENTION_MODULES; XLNet has neither
    local windows nor rotary positions, so `local_window` and `rope_theta` are unused."""

    config: EncoderConfig
    local_window: int | None = None
    rope_theta: float = 0.0

    def setup(self):
        cfg = self.config
        heads = (cfg.num_heads, cfg.head_dim)
        project = lambda name: dense(cfg, heads, ("embed", "heads", "kv"), use_bias=False, name=name)
        self.query, self.key, self.value, self.relative = (project(n) for n in ("query", "key", "value",
                                                                                 "relative"))
        self.out = dense(cfg, cfg.hidden_size, ("heads", "kv", "embed"), use_bias=False, in_ndim=2, name="out")
        vector = lambda name: self.param(name, kernel_init(cfg, ("heads", "kv")), heads, param_dtype(cfg))
        self.content_bias = vector("content_bias")
        self.position_bias = vector("position_bias")
        self.segment_bias = vector("segment_bias")
        self.segment_embed = self.param("segment_embed", kernel_init(cfg, ("token_type", "heads", "kv")),
                                        (2, *heads), param_dtype(cfg))
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def _attend(self, q, k, v, k_rel, segment_differs, allowed, deterministic):
        """q [b, i, n, d] over k, v [b, j, n, d] -> [b, i, n, d]."""
        f32, dtype = jnp.float32, q.dtype
        content = jnp.einsum("bind,bjnd->bnij", q + self.content_bias.astype(dtype), k, preferred_element_type=f32)
        position = shift_relative(jnp.einsum("bind,pnd->bnip", q + self.position_bias.astype(dtype), k_rel,
                                             preferred_element_type=f32))
        by_type = jnp.einsum("bind,snd->bnis", q + self.segment_bias.astype(dtype), self.segment_embed.astype(dtype),
                             preferred_element_type=f32)
        segment = jnp.where(segment_differs[:, None], by_type[..., 1:2], by_type[..., 0:1])
        scores = (content + position + segment) * (self.config.head_dim ** -0.5)
        scores = jnp.where(allowed[:, None], scores, MASKED_SCORE)
        probs = self.dropout(jax.nn.softmax(scores, axis=-1), deterministic=deterministic)
        return jnp.einsum("bnij,bjnd->bind", probs.astype(v.dtype), v)

    def __call__(self, h: jax.Array, g: jax.Array | None, context: StreamContext,
                 deterministic: bool = True) -> tuple[jax.Array, jax.Array | None]:
        """Attention outputs (before the residual and norm) of the content stream h [b, s, hidden] and of the query
        stream g [b, num_predict, hidden] (None: no query stream)."""
        k, v = self.key(h), self.value(h)
        k_rel = self.relative(context.relative_encoding.astype(h.dtype))
        h_out = self._attend(self.query(h), k, v, k_rel, context.segment_differs, context.content_allowed,
                             deterministic)
        h_out = nn.with_logical_constraint(h_out, ("activation_batch", "activation_length", "activation_heads",
                                                   "activation_kv"))
        if g is None:
            return self.out(h_out), None
        # transformers' formulation, kept for exactness with any target_mapping: slot queries are placed at the
        # positions they predict, attend over the whole row, and are read back per slot.
        mapping = context.target_mapping.astype(g.dtype)
        q_g = jnp.einsum("bmnd,bml->blnd", self.query(g), mapping)
        g_out = self._attend(q_g, k, v, k_rel, context.segment_differs, context.query_allowed, deterministic)
        g_out = jnp.einsum("blnd,bml->bmnd", g_out, mapping)
        return self.out(h_out), self.out(g_out)
