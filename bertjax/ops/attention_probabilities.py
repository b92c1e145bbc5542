"""Attention probabilities as a [batch, heads, seq, seq] array: for looking inside a model, never for running it.

The attention implementations never form this matrix (the fast ones never hold more than a tile of it); when a
user asks for the probabilities (bertjax.intermediates), the layer recomputes them here from its q and k, with the
same mask rules (bertjax.ops.masks), so they are the softmax the layer applied.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from bertjax.ops.masks import attention_mask


def attention_probabilities(q: jax.Array, k: jax.Array, *, segment_ids: jax.Array, local_window: int | None,
                            scale: float) -> jax.Array:
    """q [batch, seq, heads, head_dim], k [batch, seq, kv_heads, head_dim] -> float32 [batch, heads, seq, seq].

    Rows of padding queries (segment 0) are all zeros rather than a softmax over nothing.
    """
    heads, kv_heads = q.shape[2], k.shape[2]
    k = jnp.repeat(k, heads // kv_heads, axis=2)  # GQA: query head h reads key head h // group
    scores = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
    visible = attention_mask(segment_ids, segment_ids, local_window)[:, None]
    probabilities = jax.nn.softmax(jnp.where(visible, scores, -jnp.inf), axis=-1, where=visible)
    return jnp.where(visible, probabilities, 0.0)
