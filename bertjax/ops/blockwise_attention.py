"""Sliding-window attention in plain XLA whose memory and compute grow as O(seq * window), not O(seq^2).

The sequence is cut into query chunks of `chunk` tokens. A query chunk can only see keys within `window // 2` of
its own tokens, i.e. the key chunks from `n = ceil(half / chunk)` before it to `n` after it. Those 2n + 1 key
chunks are gathered with static slices of a padded copy of k and v (no gather op, so autodiff gives plain pads and
adds), and one batched matmul scores every query chunk against its own key slab. Work per query is
(2n + 1) * chunk keys, a small constant times the window, whatever the sequence length.

Global layers, and windows that cover the whole sequence, have nothing to skip: they go to the dense reference,
which computes exactly the same function.

`xla_auto_attention` is what "auto" runs on CPU: it picks this path or the dense one per call, by a rule measured
with `python -m bench.attention_bench` (see docs/benchmarks.md, "Attention kernels").
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.ops.xla_attention import dense_attention


def default_chunk(half: int) -> int:
    """Query chunk length: the half-window (slabs of 3 chunks) within [16, 64] rows.

    Measured on the 2-core CPU, window 128 and 256, seq 2048-4096: 64-row chunks beat 32 (more, smaller matmuls)
    and 128 (slabs of 384 keys for a 129-key window) by 1.5-3.5x, forward and backward.
    """
    return min(64, max(16, half))


def blockwise_local_attention(q, k, v, *, segment_ids, local_window, scale, interpret=False,
                              chunk: int | None = None):
    del interpret  # no kernel to interpret
    seq = q.shape[1]
    if local_window is None or local_window // 2 >= seq - 1:
        return dense_attention(q, k, v, segment_ids=segment_ids, local_window=local_window, scale=scale)
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

    def pad_seq(x, before, after):
        widths = [(0, 0)] * x.ndim
        widths[1] = (before, after)
        return jnp.pad(x, widths)

    # Key slabs: chunk c sees padded chunks c .. c + 2 * reach, i.e. original chunks c - reach .. c + reach.
    # Padding has segment id 0, so it is masked like any padding token.
    def key_slabs(x):
        x = pad_seq(x, reach * chunk, tail + reach * chunk)
        x = x.reshape(batch, num_chunks + 2 * reach, chunk, *x.shape[2:])
        return jnp.concatenate([x[:, i:i + num_chunks] for i in range(2 * reach + 1)], axis=2)

    k_slab = key_slabs(k)  # [batch, chunks, slab, kv_heads, head_dim]
    v_slab = key_slabs(v)
    seg_q = pad_seq(segment_ids, 0, tail).reshape(batch, num_chunks, chunk)
    seg_k = key_slabs(segment_ids)  # [batch, chunks, slab]

    # The window part of the mask depends only on positions, so it is a compile-time constant.
    q_pos = np.arange(num_chunks)[:, None] * chunk + np.arange(chunk)[None, :]
    k_pos = (np.arange(num_chunks)[:, None] - reach) * chunk + np.arange(slab)[None, :]
    near = np.abs(q_pos[:, :, None] - k_pos[:, None, :]) <= half  # [chunks, chunk, slab]
    mask = (seg_q[..., None] == seg_k[:, :, None, :]) & (seg_q[..., None] != 0) & near[None]

    q_chunks = pad_seq(q, 0, tail).reshape(batch, num_chunks, chunk, kv_heads, group, head_dim)
    scores = jnp.einsum("bcqhgd,bckhd->bchgqk", q_chunks, k_slab, preferred_element_type=jnp.float32) * scale
    # Same finite floor as the dense reference: padding rows stay finite, and valid rows are unchanged.
    scores = jnp.where(mask[:, :, None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bchgqk,bckhd->bcqhgd", probs, v_slab, preferred_element_type=jnp.float32)
    return out.reshape(batch, padded, heads, head_dim)[:, :seq].astype(q.dtype)


# Measured on the 2-core CPU against the dense path (docs/benchmarks.md; 12 heads x 64, float32), speed-up of
# blockwise forward / forward+backward: window 128: seq 256 (w/seq 1/2) 0.7x / 0.95x, seq 384 (1/3) 1.2x / 1.4x,
# seq 512 (1/4) 1.6x / 4.2x, seq 2048 7x / 10x; window 32: seq 96 (1/3) 0.8x / 0.8x, seq 128 (1/4) 0.8x / 1.45x.
# Below ~1/4 the slabs of 3 chunks do nearly the dense amount of work, with slicing on top.
BLOCKWISE_MAX_WINDOW_FRACTION = 0.25


def xla_auto_attention(q, k, v, *, segment_ids, local_window, scale, interpret=False):
    """The faster XLA path for this call's shapes: blockwise for narrow windows, dense otherwise."""
    seq = q.shape[1]
    narrow = local_window is not None and local_window <= BLOCKWISE_MAX_WINDOW_FRACTION * seq
    fn = blockwise_local_attention if narrow else dense_attention
    return fn(q, k, v, segment_ids=segment_ids, local_window=local_window, scale=scale, interpret=interpret)


def blockwise_work(seq: int, local_window: int, chunk: int | None = None) -> int:
    """Query-key pairs scored per head by `blockwise_local_attention` (for benchmarks and tests)."""
    half = local_window // 2
    chunk = chunk or default_chunk(half)
    return math.ceil(seq / chunk) * chunk * (2 * math.ceil(half / chunk) + 1) * chunk
