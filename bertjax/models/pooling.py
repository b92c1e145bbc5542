"""Pooling token states into one vector per segment (packed rows: segment ids 1, 2, ...; 0 = padding).

Task heads and embedding models pool through these functions, so a packed row yields one vector per example:
slot k of `max_segments` holds segment k + 1. Without `max_segments` the whole row (every non-padding token) is one
example, as in an unpacked batch.

The modes are sentence-transformers' (`Pooling` of sentence_transformers 6.x), computed per slot instead of per
row so that a packed row gives what one text per row gives:

    cls                   the slot's first pooled token
    max                   elementwise max over the pooled tokens
    mean                  their mean
    mean_sqrt_len_tokens  their sum / sqrt(count)
    weightedmean          mean weighted by position in the text (1, 2, ...; an excluded prompt keeps its
                          positions, so the text's tokens keep their weights)
    lasttoken             the slot's last pooled token

"Pooled tokens" are the `member` mask: a slot's tokens minus any prompt tokens the caller excluded
(`include_prompt=False`). Where a slot pools nothing: cls takes the slot's first token (sentence-transformers takes
the row's first), mean-like modes and lasttoken give zeros (as sentence-transformers), and max gives zeros too
(sentence-transformers gives -inf, which normalises to NaN).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.models.inputs import check_ids
from bertjax.ops import segment_positions

# Floor on the denominators, as sentence-transformers clamps them (min=1e-9): an empty slot divides 0 by it.
_MIN_WEIGHT = 1e-9


def segment_membership(segment_ids: jax.Array, max_segments: int | None) -> jax.Array:
    """[batch, seq, K] bool: token t belongs to slot k. K = 1 (all non-padding tokens) without max_segments.

    Segment ids above max_segments would fall in no slot and their texts get no output, silently: an error, checked
    as token ids are (eagerly, or on the device inside bertjax.checked)."""
    if max_segments is None:
        return (segment_ids != 0)[..., None]
    if isinstance(max_segments, (bool, jax.core.Tracer)) or not isinstance(max_segments, (int, np.integer)):
        raise TypeError(f"max_segments must be a static Python int (it fixes the output's shape; under jax.jit pass "
                        f"it in static_argnames), got {type(max_segments).__name__}")
    if max_segments <= 0:
        raise ValueError(f"max_segments must be positive, got {max_segments}")
    check_ids(segment_ids, max_segments + 1, "segment_ids",
              f" (max_segments={max_segments} slots: packed texts 1..{max_segments}, 0 padding)")
    return segment_ids[..., None] == jnp.arange(1, max_segments + 1, dtype=segment_ids.dtype)


def _first_index(member: jax.Array) -> jax.Array:
    """[batch, K]: index of each slot's first True (0 when there is none)."""
    return jnp.argmax(member, axis=1)


def _last_index(member: jax.Array) -> jax.Array:
    """[batch, K]: index of each slot's last True (seq - 1 when there is none, as sentence-transformers)."""
    seq = member.shape[1]
    return seq - 1 - jnp.argmax(member[:, ::-1], axis=1)


def _gather(x: jax.Array, index: jax.Array) -> jax.Array:
    """x [batch, seq, dim] at index [batch, K] -> [batch, K, dim]."""
    return jnp.take_along_axis(x, index[..., None], axis=1)


def _cls(x, member, weights):
    return _gather(x, _first_index(member))


def _lasttoken(x, member, weights):
    found = jnp.any(member, axis=1)[..., None]
    return jnp.where(found, _gather(x, _last_index(member)), 0.0)


def _max(x, member, weights):
    # A segment max over flat (row, slot) ids: O(batch * seq * dim) memory, where a masked [batch, seq, K, dim]
    # broadcast would grow with the number of slots. Tokens in no slot go to one extra, discarded id.
    batch, seq, slots = member.shape
    flat_slot = jnp.arange(batch)[:, None] * slots + jnp.argmax(member, axis=-1)
    flat_slot = jnp.where(jnp.any(member, axis=-1), flat_slot, batch * slots)
    pooled = jax.ops.segment_max(x.reshape(batch * seq, -1), flat_slot.reshape(-1), num_segments=batch * slots + 1)
    found = jnp.any(member, axis=1)[..., None]
    return jnp.where(found, pooled[:-1].reshape(batch, slots, -1), 0.0)


def _weighted_sum(x, weights):
    return jnp.einsum("bsk,bsd->bkd", weights, x, precision=jax.lax.Precision.HIGHEST)


def _mean(x, member, weights):
    count = member.astype(jnp.float32).sum(axis=1)[..., None]
    return _weighted_sum(x, member.astype(jnp.float32)) / jnp.maximum(count, _MIN_WEIGHT)


def _mean_sqrt_len(x, member, weights):
    count = member.astype(jnp.float32).sum(axis=1)[..., None]
    return _weighted_sum(x, member.astype(jnp.float32)) / jnp.sqrt(jnp.maximum(count, _MIN_WEIGHT))


def _weightedmean(x, member, weights):
    w = jnp.where(member, weights[..., None], 0.0)  # [batch, seq, K]
    return _weighted_sum(x, w) / jnp.maximum(w.sum(axis=1)[..., None], _MIN_WEIGHT)


PoolFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
# (x float32 [batch, seq, dim], member bool [batch, seq, K], weights float32 [batch, seq]) -> [batch, K, dim]
POOLING_MODES: dict[str, PoolFn] = {
    "cls": _cls,
    "max": _max,
    "mean": _mean,
    "mean_sqrt_len_tokens": _mean_sqrt_len,
    "weightedmean": _weightedmean,
    "lasttoken": _lasttoken,
}
# Task heads' names: "late" (EuroBERT) averages per-token logits, i.e. mean pooling of what it is given; "last" is
# XLNet's summary token <cls>, which ends each example.
_ALIASES = {"late": "mean", "last": "lasttoken"}


def pool_segments(x: jax.Array, member: jax.Array, pooling: str, weights: jax.Array | None = None) -> jax.Array:
    """x [batch, seq, dim] -> [batch, K, dim] in x's dtype (accumulated in float32): one mode of POOLING_MODES.

    `weights` [batch, seq] are weightedmean's position weights; by default 1, 2, ... from each row's first token
    (pass `text_position_weights(segment_ids)` on packed rows).
    """
    mode = _ALIASES.get(pooling, pooling)
    if mode not in POOLING_MODES:
        raise ValueError(f"unknown pooling {pooling!r}; known: {', '.join([*POOLING_MODES, *_ALIASES])}")
    if weights is None:
        weights = jnp.broadcast_to(jnp.arange(1, x.shape[1] + 1, dtype=jnp.float32), x.shape[:2])
    if mode == "cls":  # a gather: no float32 round trip
        return _cls(x, member, weights)
    return POOLING_MODES[mode](x.astype(jnp.float32), member, weights.astype(jnp.float32)).astype(x.dtype)


def text_position_weights(segment_ids: jax.Array) -> jax.Array:
    """[batch, seq] float32: 1, 2, ... restarting at every segment (weightedmean's weights on packed rows)."""
    return (segment_positions(segment_ids) + 1).astype(jnp.float32)


def pool_sentences(x: jax.Array, segment_ids: jax.Array, max_segments: int, modes: Sequence[str],
                   prompt_lengths: jax.Array | int | None = None) -> jax.Array:
    """Sentence embeddings of packed rows: float32 [batch, max_segments, len(modes) * dim], modes concatenated.

    `prompt_lengths` (an int, or [batch, max_segments] ints) excludes each text's first tokens from pooling, as
    sentence-transformers' `include_prompt=False` does: the prompt's tokens with the leading [CLS], without the
    prompt's own trailing [SEP]. Empty slots hold zeros.
    """
    unknown = [mode for mode in modes if mode not in POOLING_MODES]
    if unknown or not modes:
        raise ValueError(f"pooling modes must be some of {', '.join(POOLING_MODES)}; got {list(modes)}")
    x = x.astype(jnp.float32)
    in_segment = segment_membership(segment_ids, max_segments)
    member = in_segment
    if prompt_lengths is not None:
        position = segment_positions(segment_ids)  # [batch, seq]
        lengths = jnp.broadcast_to(jnp.asarray(prompt_lengths, jnp.int32), in_segment.shape[::2])  # [batch, K]
        member = in_segment & (position[..., None] >= lengths[:, None, :])
    # cls of a slot whose every token is excluded takes the slot's first token (sentence-transformers: the row's).
    cls_member = jnp.where(jnp.any(member, axis=1, keepdims=True), member, in_segment)
    weights = text_position_weights(segment_ids)
    pooled = [POOLING_MODES[mode](x, cls_member if mode == "cls" else member, weights) for mode in modes]
    pooled = jnp.concatenate(pooled, axis=-1) if len(pooled) > 1 else pooled[0]
    return jnp.where(jnp.any(in_segment, axis=1)[..., None], pooled, 0.0)
