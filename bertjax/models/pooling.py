"""Pooling token states into one vector per segment (packed rows: segment ids 1, 2, ...; 0 = padding).

Task heads and embedding models pool through these functions, so a packed row yields one vector per example:
slot k of `max_segments` holds segment k + 1. Without `max_segments` the whole row (every non-padding token) is one
example, as in an unpacked batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def segment_membership(segment_ids: jax.Array, max_segments: int | None) -> jax.Array:
    """[batch, seq, K] bool: token t belongs to slot k. K = 1 (all non-padding tokens) without max_segments."""
    if max_segments is None:
        return (segment_ids != 0)[..., None]
    if max_segments <= 0:
        raise ValueError(f"max_segments must be positive, got {max_segments}")
    return segment_ids[..., None] == jnp.arange(1, max_segments + 1, dtype=segment_ids.dtype)


def pool_segments(x: jax.Array, member: jax.Array, pooling: str) -> jax.Array:
    """x [batch, seq, dim] -> [batch, K, dim]: each slot's first token ("cls"), last token ("last") or token mean
    ("mean").

    An empty slot pools to the first token of the row (cls) or zeros (mean); callers mask it out.
    """
    if pooling == "cls":
        first = jnp.argmax(member, axis=1)  # [batch, K]: index of the first True (0 when there is none)
        return jnp.take_along_axis(x, first[..., None], axis=1)
    if pooling == "last":  # XLNet's summary token <cls> ends each example
        last = member.shape[1] - 1 - jnp.argmax(member[:, ::-1], axis=1)
        return jnp.take_along_axis(x, last[..., None], axis=1)
    if pooling in ("mean", "late"):
        weights = member.astype(jnp.float32)
        total = jnp.einsum("bsk,bsd->bkd", weights, x.astype(jnp.float32))
        count = jnp.maximum(weights.sum(axis=1), 1.0)[..., None]
        return (total / count).astype(x.dtype)
    raise ValueError(f"unknown classifier_pooling {pooling!r}; known: cls, last, mean, late")
