"""Attention probabilities as a [batch, heads, seq, seq] array: for looking inside a model, never for running it.

The attention implementations never form this matrix (the fast ones never hold more than a tile of it); when a
user asks for the probabilities (bertjax.intermediates), the layer recomputes them here from its q and k, with the
same mask and bias rules (bertjax.ops.masks), so they are the softmax the layer applied.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.ops.masks import alibi_bias, attention_mask


def attention_probabilities(q: jax.Array, k: jax.Array, *, segment_ids: jax.Array, local_window: int | None,
                            scale: float, alibi_slopes: jax.Array | None = None,
                            global_tokens: jax.Array | None = None) -> jax.Array:
    """q [batch, seq, heads, head_dim], k [batch, seq, kv_heads, head_dim] -> float32 [batch, heads, seq, seq].

    Rows of padding queries (segment 0) are all zeros rather than a softmax over nothing. alibi_slopes and
    global_tokens mean what they mean in `bertjax.ops.attention`.
    """
    heads, kv_heads, seq = q.shape[2], k.shape[2], q.shape[1]
    k = jnp.repeat(k, heads // kv_heads, axis=2)  # GQA: query head h reads key head h // group
    scores = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes, jnp.arange(seq), jnp.arange(seq))[None]
    if global_tokens is not None:
        global_tokens = jnp.asarray(global_tokens, bool) & (segment_ids != 0)
    visible = attention_mask(segment_ids, segment_ids, local_window, q_global=global_tokens,
                             kv_global=global_tokens)[:, None]
    probabilities = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1, where=visible)
    return jnp.where(visible, probabilities, 0.0)
