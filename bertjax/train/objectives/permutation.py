"""XLNet's factorisation orders, drawn per row on the device: which tokens to predict and what each may see.

Following the released XLNet code (data_utils.py `_sample_mask` and `_local_perm`):
- Targets are spans. The row is cut into consecutive windows; window t has a span length n ~ p(n) ∝ 1/n for
  n in 1..max_span and width K * n, and a span of n tokens at a uniform offset inside it, so a fraction 1/K of the
  tokens is predicted (partial prediction, K = 6 in the paper). Padding is never a target, nor are the special
  tokens the pipeline puts at both ends of every document piece ([CLS] first, [SEP] last: bertjax.data.packing),
  as XLNet never predicts its functional tokens.
- The order: every non-target comes first (they see each other), targets follow in a uniformly random order. A
  target's query stream sees the non-targets and the targets before it; its content stream also sees itself.
  In perm_mask terms (1 = may not attend): perm_mask[i, j] = target[j] and rank[j] >= rank[i], with rank -1 for
  non-targets.
Packed rows need nothing more: attention never crosses documents, so one order over the row is an order within
each document.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class PermutationBatch:
    perm_mask: jax.Array  # [batch, seq, seq] float32: 1 = i may not attend to j
    target_mapping: jax.Array  # [batch, num_predict, seq] float32: one-hot rows, zeros for unused slots
    target_positions: jax.Array  # [batch, num_predict] int32: the predicted positions, ascending (0 when unused)
    target_weights: jax.Array  # [batch, num_predict] float32: 1 for a real prediction


def span_targets(key: jax.Array, segment_ids: jax.Array, ratio: int, max_span: int) -> jax.Array:
    """[batch, seq] bool: the tokens to predict, in spans covering 1/ratio of each row on average."""
    batch, seq = segment_ids.shape
    windows = -(-seq // ratio)  # every window is at least `ratio` wide
    length_key, offset_key = jax.random.split(key)
    lengths = jnp.arange(1, max_span + 1, dtype=jnp.float32)
    span = 1 + jax.random.categorical(length_key, -jnp.log(lengths), shape=(batch, windows))
    width = ratio * span
    window_start = jnp.cumsum(width, axis=1) - width
    start = window_start + jnp.floor(jax.random.uniform(offset_key, (batch, windows)) * (width - span + 1)
                                     ).astype(span.dtype)
    position = jnp.arange(seq)[None, None, :]
    inside = (position >= start[..., None]) & (position < (start + span)[..., None])
    real = segment_ids > 0
    before = jnp.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1]
    after = jnp.pad(segment_ids, ((0, 0), (0, 1)))[:, 1:]
    piece_ends = (segment_ids != before) | (segment_ids != after)  # a piece's [CLS] and [SEP]
    return jnp.any(inside, axis=1) & real & ~piece_ends


def sample_permutation(key: jax.Array, segment_ids: jax.Array, *, ratio: int, max_span: int,
                       num_predict: int) -> PermutationBatch:
    """Targets (at most num_predict per row, the first ones by position), a random order, and the model inputs."""
    target_key, order_key = jax.random.split(key)
    target = span_targets(target_key, segment_ids, ratio, max_span)
    target &= jnp.cumsum(target, axis=1) <= num_predict
    # Integer ranks, ties broken by position: float32 uniforms repeat (about 2e-5 of rows hold two targets of one
    # rank), and two targets of one rank would hide each other, which no order does.
    draws = jax.random.uniform(order_key, target.shape)
    rank = jnp.where(target, jnp.argsort(jnp.argsort(draws, axis=1, stable=True), axis=1), -1)
    hidden = target[:, None, :] & (rank[:, None, :] >= rank[:, :, None])
    # Slots in position order: stable sort puts the targets first.
    positions = jnp.argsort(~target, axis=1, stable=True)[:, :num_predict].astype(jnp.int32)
    used = jnp.arange(num_predict)[None, :] < jnp.sum(target, axis=1, keepdims=True)
    # A target whose query stream can see nothing (a document made only of targets, its first one in the order)
    # would average over everything, itself included: such a prediction is not counted.
    same_document = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] > 0)
    sees_something = jnp.any(same_document & ~hidden, axis=2)
    used &= jnp.take_along_axis(sees_something, positions, axis=1)
    mapping = jax.nn.one_hot(positions, segment_ids.shape[1], dtype=jnp.float32) * used[..., None]
    return PermutationBatch(perm_mask=hidden.astype(jnp.float32), target_mapping=mapping,
                            target_positions=jnp.where(used, positions, 0), target_weights=used.astype(jnp.float32))
