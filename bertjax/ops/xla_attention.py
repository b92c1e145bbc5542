"""Dense attention in plain XLA: the reference every other implementation is tested against.

Layout matters on CPU: XLA's batched matmul is several times faster when batch and head axes lead
([batch, heads, seq, head_dim]) than when it has to gather them from [batch, seq, heads, head_dim], and dividing
by the softmax denominator after the second matmul touches [seq, head_dim] values instead of [seq, seq].
Its scores are [seq, seq] by nature, so the ALiBi bias is added to them whole; the long-sequence implementations
build it per tile instead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.ops.masks import alibi_bias, attention_mask

# Added to masked scores. Finite, so a row with no visible key (a padding query) stays finite instead of NaN.
MASKED = -1e30


def unnormalised_softmax(scores: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(exp(scores - row max), row sum of that): divide after the value matmul, where it touches fewer values.

    The shift by the row maximum only keeps exp finite; softmax does not depend on it, so it carries no gradient.
    Without the stop_gradient, autodiff differentiates through the max: an equality mask, a select and a reduction
    over every [seq, seq] score in the backward pass, all to add terms that cancel.
    """
    weights = jnp.exp(scores - jax.lax.stop_gradient(scores.max(axis=-1, keepdims=True)))
    return weights, weights.sum(axis=-1, keepdims=True)  # >= 1: the row maximum contributes exp(0)


def dense_attention(q, k, v, *, segment_ids, local_window, scale, interpret=False, alibi_slopes=None,
                    global_tokens=None, global_slots=None):
    del interpret, global_slots  # no kernel to interpret; every position is a possible global key
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    # Query heads that share a key/value head (GQA) become extra query rows of that head, so k and v are never
    # repeated in memory: q [b, s, kv*g, d] -> [b, kv, g*s, d].
    qt = (q * jnp.asarray(scale, q.dtype)).reshape(batch, seq, kv_heads, group, head_dim)
    qt = qt.transpose(0, 2, 3, 1, 4).reshape(batch, kv_heads, group * seq, head_dim)
    kt = k.transpose(0, 2, 1, 3)
    vt = v.transpose(0, 2, 1, 3)
    scores = jnp.einsum("bhqd,bhkd->bhqk", qt, kt, preferred_element_type=jnp.float32)
    visible = attention_mask(segment_ids, segment_ids, local_window, q_global=global_tokens,
                             kv_global=global_tokens)
    scores = scores.reshape(batch, kv_heads, group, seq, seq)
    if alibi_slopes is not None:
        positions = jnp.arange(seq)
        scores = scores + alibi_bias(alibi_slopes, positions, positions).reshape(1, kv_heads, group, seq, seq)
    scores = jnp.where(visible[:, None, None], scores, MASKED)
    weights, denominator = unnormalised_softmax(scores)
    weights = weights.astype(v.dtype).reshape(batch, kv_heads, group * seq, seq)
    out = jnp.einsum("bhqk,bhkd->bhqd", weights, vt, preferred_element_type=jnp.float32)
    out = out.reshape(batch, kv_heads, group, seq, head_dim) / denominator
    return out.transpose(0, 3, 1, 2, 4).reshape(batch, seq, heads, head_dim).astype(q.dtype)
