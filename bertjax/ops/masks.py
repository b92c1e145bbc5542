"""Mask, bias and position helpers derived from segment ids (0 = padding, equal ids = one packed document)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np


def attention_mask(q_segment_ids: jax.Array, kv_segment_ids: jax.Array, local_window: int | None,
                   q_offset: int | jax.Array = 0, kv_offset: int | jax.Array = 0, q_global: jax.Array | None = None,
                   kv_global: jax.Array | None = None) -> jax.Array:
    """Boolean [batch, q_len, kv_len] mask: same non-padding segment and, for local layers, |i - j| <= window // 2
    unless the query or the key is a global token (q_global / kv_global: bool [batch, q_len] / [batch, kv_len]).

    Offsets give the absolute positions of the first query and key, so blockwise implementations can build the
    mask of one tile with the same function as the dense reference. Padding never attends nor is attended, global
    or not: the segment test alone decides that.
    """
    same = (q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]) & (q_segment_ids[:, :, None] != 0)
    if local_window is None:
        return same
    q_pos = q_offset + jnp.arange(q_segment_ids.shape[1])[:, None]
    kv_pos = kv_offset + jnp.arange(kv_segment_ids.shape[1])[None, :]
    near = (jnp.abs(q_pos - kv_pos) <= local_window // 2)[None]
    if q_global is not None:
        near = near | q_global[:, :, None] | kv_global[:, None, :]
    return same & near


def alibi_bias(slopes: jax.Array, q_positions: jax.Array, kv_positions: jax.Array) -> jax.Array:
    """ALiBi's additive score bias -slope_h * |i - j|: float32 [heads, q_len, kv_len] for the given positions.

    Positions are the row's absolute positions, not positions inside each packed document: documents are
    contiguous, so two tokens of one document are the same distance apart either way, and tokens of different
    documents never see each other. Callers build it per tile, never for a whole [seq, seq] score matrix at once
    (except the dense reference, whose scores are [seq, seq] anyway).
    """
    distance = jnp.abs(q_positions[:, None] - kv_positions[None, :]).astype(jnp.float32)
    return -slopes.astype(jnp.float32)[:, None, None] * distance[None]


def segment_positions(segment_ids: jax.Array) -> jax.Array:
    """Position of each token inside its own segment: restarts at 0 wherever the segment id changes."""
    seq = segment_ids.shape[-1]
    index = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), segment_ids.shape)
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[..., :1], dtype=bool), segment_ids[..., 1:] != segment_ids[..., :-1]], axis=-1)
    start_index = jax.lax.cummax(jnp.where(starts, index, 0), axis=segment_ids.ndim - 1)
    return index - start_index


# Rows up to Longformer's usual window (512) are one window already: their [seq, seq] global program costs no more
# than local attention, and model.init traces short example rows. Past it, an unbounded traced mask is a warning.
UNBOUNDED_GLOBAL_WARNING_LENGTH = 512


def global_slots(global_tokens: jax.Array, max_global_tokens: int | None) -> int:
    """How many global positions per row an implementation gathers (a static count).

    With a bound, that bound (checked against the input when it is concrete); without one, the largest count of a
    concrete input, or every position when the mask is traced (correct for any mask, quadratic in the length).
    """
    seq = global_tokens.shape[1]
    concrete = not isinstance(global_tokens, jax.core.Tracer)
    most = int(np.asarray(global_tokens).sum(axis=1).max(initial=0)) if concrete else None
    if max_global_tokens is not None:
        if most is not None and most > max_global_tokens:
            raise ValueError(f"global_attention_mask: a row has {most} global tokens, more than "
                             f"max_global_tokens={max_global_tokens} (a Longformer's longformer.max_global_tokens)")
        return min(max_global_tokens, seq)
    if most is None:
        if seq > UNBOUNDED_GLOBAL_WARNING_LENGTH:
            warnings.warn(f"Longformer global attention traced without a bound (longformer.max_global_tokens=None): "
                          f"every one of the {seq} positions is a global slot, a [seq, seq] program. Set the most "
                          "global tokens a row has to keep it linear in the length", stacklevel=2)
        return seq
    return max(most, 1)


def flagged_first(flags: jax.Array, slots: int) -> tuple[jax.Array, jax.Array]:
    """(positions [batch, slots] int32, valid [batch, slots]): each row's flagged positions first, in order (a
    stable sort of "not flagged"), cut to a static number of slots; `valid` says which slots hold a flagged one."""
    slots = min(slots, flags.shape[1])
    positions = jnp.argsort(~flags, axis=1, stable=True)[:, :slots].astype(jnp.int32)
    return positions, jnp.take_along_axis(flags, positions, axis=1)


def scatter_slots(out: jax.Array, positions: jax.Array, valid: jax.Array, values: jax.Array) -> jax.Array:
    """`out` [batch, seq, ...] with the rows at `positions` [batch, slots] replaced by `values` [batch, slots, ...];
    invalid slots (past a row's last flagged position) write nowhere."""
    target = jnp.where(valid, positions, out.shape[1])
    return out.at[jnp.arange(out.shape[0])[:, None], target].set(values, mode="drop")
