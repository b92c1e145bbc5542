"""Sliding-window attention in plain XLA whose memory and compute grow as O(seq * window), not O(seq^2).

The sequence is cut into query chunks of `chunk` tokens. A query chunk can only see keys within `window // 2` of
its own tokens, i.e. the key chunks from `n = ceil(half / chunk)` before it to `n` after it. Those 2n + 1 key
chunks are gathered with static slices of a padded copy of k and v (no gather op, so autodiff gives plain pads and
adds), and one batched matmul scores every query chunk against its own key slab. Work per query is
(2n + 1) * chunk keys, a small constant times the window, whatever the sequence length.

Global layers, and windows that cover the whole sequence, have nothing to skip: short ones go to the dense reference,
which computes exactly the same function; from GLOBAL_CHUNKED_MIN_SEQ tokens they run one query chunk at a time
(`query_chunked_attention`), so memory stays linear in the sequence (MosaicBERT's ALiBi layers at long lengths).
ALiBi adds -slope * |i - j| per tile; global tokens (Longformer) add, next to every slab, the keys of the row's
global tokens (gathered into `global_slots` static slots), and their own query rows attend to the whole segment:
work and memory O(seq * (window + globals)).

`xla_auto_attention` is what "auto" runs on CPU: it picks this path or the dense one per call, by a rule measured
with `python -m bench.attention_bench` (see docs/benchmarks.md, "Attention kernels").
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bertjax.ops.masks import flagged_first, scatter_slots
from bertjax.ops.xla_attention import MASKED, dense_attention, unnormalised_softmax


def default_chunk(half: int) -> int:
    """Query chunk length: the half-window (slabs of 3 chunks) within [16, 64] rows.

    Measured on the 2-core CPU, window 128 and 256, seq 2048-4096: 64-row chunks beat 32 (more, smaller matmuls)
    and 128 (slabs of 384 keys for a 129-key window) by 1.5-3.5x, forward and backward.
    """
    return min(64, max(16, half))


# Global layers at least this long run query chunk by query chunk (memory O(seq * GLOBAL_QUERY_CHUNK) instead of the
# dense [seq, seq]); shorter ones run the dense program, which is faster while its scores fit comfortably.
GLOBAL_CHUNKED_MIN_SEQ = 2048
GLOBAL_QUERY_CHUNK = 256


def query_chunked_attention(q, k, v, *, segment_ids, scale, alibi_slopes=None, chunk: int = GLOBAL_QUERY_CHUNK):
    """Global attention one query chunk at a time: each step scores `chunk` queries against every key, so a step
    holds [chunk, seq] scores, and the step is rematerialised in the backward pass (jax.checkpoint), so training
    memory grows linearly with the sequence too. The ALiBi bias is built per step from positions."""
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    num_chunks = -(-seq // chunk)
    tail = num_chunks * chunk - seq
    qt = jnp.pad(q * jnp.asarray(scale, q.dtype), ((0, 0), (0, tail), (0, 0), (0, 0)))
    qt = qt.reshape(batch, num_chunks, chunk, kv_heads, group, head_dim).transpose(1, 0, 3, 4, 2, 5)
    seg_q = jnp.pad(segment_ids, ((0, 0), (0, tail))).reshape(batch, num_chunks, chunk).transpose(1, 0, 2)
    kt, vt = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [batch, kv_heads, seq, head_dim]
    slopes = None if alibi_slopes is None else alibi_slopes.astype(jnp.float32).reshape(kv_heads, group)

    @jax.checkpoint
    def one_chunk(args):
        index, qc, sc = args  # qc [batch, kv_heads, group, chunk, head_dim], sc [batch, chunk]
        scores = jnp.einsum("bhgqd,bhkd->bhgqk", qc, kt, preferred_element_type=jnp.float32)
        if slopes is not None:
            q_pos = index * chunk + jnp.arange(chunk)
            distance = jnp.abs(q_pos[:, None] - jnp.arange(seq)[None, :]).astype(jnp.float32)
            scores = scores - slopes[None, :, :, None, None] * distance
        visible = (sc[:, :, None] == segment_ids[:, None, :]) & (sc[:, :, None] != 0)
        scores = jnp.where(visible[:, None, None], scores, MASKED)
        weights, denominator = unnormalised_softmax(scores)
        out = jnp.einsum("bhgqk,bhkd->bhgqd", weights.astype(v.dtype), vt, preferred_element_type=jnp.float32)
        return (out / denominator).astype(q.dtype)

    out = lax.map(one_chunk, (jnp.arange(num_chunks), qt, seg_q))  # [chunks, batch, kv_heads, group, chunk, d]
    out = out.transpose(1, 0, 4, 2, 3, 5).reshape(batch, num_chunks * chunk, heads, head_dim)
    return out[:, :seq]


def blockwise_local_attention(q, k, v, *, segment_ids, local_window, scale, interpret=False, alibi_slopes=None,
                              global_tokens=None, global_slots=None, chunk: int | None = None,
                              global_query_chunk: int | None = None):
    del interpret  # no kernel to interpret
    seq = q.shape[1]
    if local_window is None or local_window // 2 >= seq - 1:
        # Global tokens cannot widen what a global layer already sees, so only the layer's own reach matters.
        if global_query_chunk is not None or seq >= GLOBAL_CHUNKED_MIN_SEQ:
            return query_chunked_attention(q, k, v, segment_ids=segment_ids, scale=scale, alibi_slopes=alibi_slopes,
                                           chunk=global_query_chunk or GLOBAL_QUERY_CHUNK)
        return dense_attention(q, k, v, segment_ids=segment_ids, local_window=local_window, scale=scale,
                               alibi_slopes=alibi_slopes, global_tokens=global_tokens)
    half = local_window // 2
    chunk = chunk or default_chunk(half)
    if chunk <= 0:
        raise ValueError(f"blockwise attention chunk must be positive, got {chunk}")
    batch, _, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    num_chunks = -(-seq // chunk)
    reach = -(-half // chunk)  # neighbour chunks on each side a query chunk may see
    slab = (2 * reach + 1) * chunk
    padded = num_chunks * chunk
    tail = padded - seq

    def pad_seq(x, axis, before, after):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (before, after)
        return jnp.pad(x, widths)

    # Key slabs: chunk c sees padded chunks c .. c + 2 * reach, i.e. original chunks c - reach .. c + reach.
    # Padding has segment id 0, so it is masked like any padding token.
    def key_slabs(x, axis):
        x = pad_seq(x, axis, reach * chunk, tail + reach * chunk)
        x = x.reshape(x.shape[:axis] + (num_chunks + 2 * reach, chunk) + x.shape[axis + 1:])
        return jnp.concatenate([lax.slice_in_dim(x, i, i + num_chunks, axis=axis) for i in range(2 * reach + 1)],
                               axis=axis + 1)

    # As in the dense reference, batch and head axes lead ([batch, kv_heads, chunks, rows, head_dim]) so XLA's
    # batched matmul needs no transposes inside, and query heads sharing a kv head become extra rows of that head.
    k_slab = key_slabs(k.transpose(0, 2, 1, 3), 2)  # [batch, kv_heads, chunks, slab, head_dim]
    v_slab = key_slabs(v.transpose(0, 2, 1, 3), 2)
    seg_q = pad_seq(segment_ids, 1, 0, tail).reshape(batch, num_chunks, chunk)
    seg_k = key_slabs(segment_ids, 1)  # [batch, chunks, slab]

    # The window part of the mask depends only on positions, so it is a compile-time constant.
    q_pos = np.arange(num_chunks)[:, None] * chunk + np.arange(chunk)[None, :]
    k_pos = (np.arange(num_chunks)[:, None] - reach) * chunk + np.arange(slab)[None, :]
    near = np.abs(q_pos[:, :, None] - k_pos[:, None, :]) <= half  # [chunks, chunk, slab]
    visible = (seg_q[..., None] == seg_k[:, :, None, :]) & (seg_q[..., None] != 0) & near[None]
    if global_tokens is not None:  # global keys are scored once, in the global part below, not in the slab
        visible = visible & ~key_slabs(global_tokens, 1)[:, :, None, :]

    qt = (q * jnp.asarray(scale, q.dtype)).reshape(batch, seq, kv_heads, group, head_dim)
    qt = pad_seq(qt.transpose(0, 2, 3, 1, 4), 3, 0, tail)  # [batch, kv_heads, group, padded, head_dim]
    qt = qt.reshape(batch, kv_heads, group, num_chunks, chunk, head_dim).transpose(0, 1, 3, 2, 4, 5)
    qt = qt.reshape(batch, kv_heads, num_chunks, group * chunk, head_dim)
    scores = jnp.einsum("bhcqd,bhckd->bhcqk", qt, k_slab, preferred_element_type=jnp.float32)
    scores = scores.reshape(batch, kv_heads, num_chunks, group, chunk, slab)
    slopes = None if alibi_slopes is None else alibi_slopes.astype(jnp.float32).reshape(kv_heads, group)
    if slopes is not None:
        # q_pos - k_pos = reach * chunk + i - j inside every chunk's slab: one [chunk, slab] distance table.
        distance = np.abs(reach * chunk + np.arange(chunk)[:, None] - np.arange(slab)[None, :]).astype(np.float32)
        scores = scores - slopes[None, :, None, :, None, None] * distance
    scores = jnp.where(visible[:, None, :, None], scores, MASKED)
    if global_tokens is not None:
        order, valid = flagged_first(global_tokens, global_slots or seq)
        slots = order.shape[1]
        g_seg = jnp.where(valid, jnp.take_along_axis(segment_ids, order, axis=1), -1)  # -1 matches no query
        gather = lambda x: jnp.take_along_axis(x, order[:, :, None, None], axis=1).transpose(0, 2, 1, 3)
        k_glob, v_glob = gather(k), gather(v)  # [batch, kv_heads, slots, head_dim]
        g_scores = jnp.einsum("bhcqd,bhgd->bhcqg", qt, k_glob, preferred_element_type=jnp.float32)
        g_scores = g_scores.reshape(batch, kv_heads, num_chunks, group, chunk, slots)
        if slopes is not None:
            g_distance = jnp.abs(q_pos[None, :, :, None] - order[:, None, None, :]).astype(jnp.float32)
            g_scores = g_scores - slopes[None, :, None, :, None, None] * g_distance[:, None, :, None]
        g_visible = (seg_q[..., None] == g_seg[:, None, None, :]) & (seg_q[..., None] != 0)
        scores = jnp.concatenate([scores, jnp.where(g_visible[:, None, :, None], g_scores, MASKED)], axis=-1)
    weights, denominator = unnormalised_softmax(scores)
    weights = weights.astype(v.dtype).reshape(batch, kv_heads, num_chunks, group * chunk, -1)
    out = jnp.einsum("bhcqk,bhckd->bhcqd", weights[..., :slab], v_slab, preferred_element_type=jnp.float32)
    if global_tokens is not None:
        out = out + jnp.einsum("bhcqg,bhgd->bhcqd", weights[..., slab:], v_glob,
                               preferred_element_type=jnp.float32)
    out = out.reshape(batch, kv_heads, num_chunks, group, chunk, head_dim) / denominator
    out = out.transpose(0, 2, 4, 1, 3, 5).reshape(batch, padded, heads, head_dim)
    out = out[:, :seq].astype(q.dtype)
    if global_tokens is not None:  # global queries see their whole segment: [slots, seq] scores per head
        out = _global_query_rows(out, q, k, v, segment_ids, order, valid, scale, slopes)
    return out


def _global_query_rows(out, q, k, v, segment_ids, order, valid, scale, slopes):
    """`out` with the rows of global queries replaced by attention over every key of their segment."""
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group, slots = heads // kv_heads, order.shape[1]
    qg = jnp.take_along_axis(q, order[:, :, None, None], axis=1) * jnp.asarray(scale, q.dtype)
    qg = qg.reshape(batch, slots, kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)  # [b, kv, g, slots, d]
    scores = jnp.einsum("bhgqd,bkhd->bhgqk", qg, k, preferred_element_type=jnp.float32)
    if slopes is not None:
        distance = jnp.abs(order[:, :, None] - jnp.arange(seq)[None, None, :]).astype(jnp.float32)
        scores = scores - slopes[None, :, :, None, None] * distance[:, None, None]
    q_seg = jnp.take_along_axis(segment_ids, order, axis=1)
    visible = (q_seg[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, None, :] != 0)
    scores = jnp.where(visible[:, None, None], scores, MASKED)
    weights, denominator = unnormalised_softmax(scores)
    rows = jnp.einsum("bhgqk,bkhd->bhgqd", weights.astype(v.dtype), v, preferred_element_type=jnp.float32)
    rows = (rows / denominator).transpose(0, 3, 1, 2, 4).reshape(batch, slots, heads, head_dim).astype(out.dtype)
    return scatter_slots(out, order, valid, rows)  # slots past a row's last global token write nowhere


# Measured on the 2-core CPU against the dense path (12 heads x 64,
# float32, batch 2, window 128), speed-up of blockwise forward / forward+backward after both paths moved to the
# heads-leading layout: seq 256 (w/seq 1/2) 0.99x / 1.22x, seq 384 (1/3) 1.62x / 1.62x, seq 512 (1/4) 2.1x / 2.2x.
# Wider windows relative to the sequence leave nothing to skip, and dense does the same work without the slabs.
BLOCKWISE_MAX_WINDOW_FRACTION = 0.5


def xla_auto_attention(q, k, v, *, segment_ids, local_window, scale, interpret=False, alibi_slopes=None,
                       global_tokens=None, global_slots=None):
    """The faster XLA path for this call's shapes: blockwise for narrow windows, dense otherwise."""
    seq = q.shape[1]
    # A symbolic length (a `jax.export` polymorphic in seq) takes the dense path, right at any length.
    narrow = local_window is not None and isinstance(seq, int) and local_window <= BLOCKWISE_MAX_WINDOW_FRACTION * seq
    if narrow:
        return blockwise_local_attention(q, k, v, segment_ids=segment_ids, local_window=local_window, scale=scale,
                                         alibi_slopes=alibi_slopes, global_tokens=global_tokens,
                                         global_slots=global_slots)
    return dense_attention(q, k, v, segment_ids=segment_ids, local_window=local_window, scale=scale,
                           alibi_slopes=alibi_slopes, global_tokens=global_tokens)
