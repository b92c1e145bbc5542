"""Dense attention in plain XLA: the reference every other implementation is tested against."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.ops.masks import attention_mask


def dense_attention(q, k, v, *, segment_ids, local_window, scale, interpret=False):
    del interpret  # no kernel to interpret
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    # Group query heads by the key/value head they share (GQA) instead of repeating k and v in memory.
    q = q.reshape(batch, seq, kv_heads, heads // kv_heads, head_dim)
    scores = jnp.einsum("bqhgd,bkhd->bhgqk", q, k, preferred_element_type=jnp.float32) * scale
    mask = attention_mask(segment_ids, segment_ids, local_window)[:, None, None]
    # A finite floor, not -inf: rows with no visible key (padding queries) stay finite instead of NaN.
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bhgqk,bkhd->bqhgd", probs, v, preferred_element_type=jnp.float32)
    return out.reshape(batch, seq, heads, head_dim).astype(q.dtype)
