"""DeBERTa's disentangled attention as a pure function: content-to-content plus content-to-position (c2p) and
position-to-content (p2c) terms over bucketed relative distances.

    score[i, j] = (q_i . k_j + q_i . Kr[idx(i - j)] + k_j . Qr[idx(i - j)]) / sqrt(d * (1 + number of terms))

Kr and Qr are the relative embedding table projected by the layer ([2 * span, heads, head_dim]), idx the clamped
bucket of a distance (`relative_index`). transformers takes p2c's index at j - i and negates it; the bucket function
is odd, so both terms read the same index table.

The relative terms are gathered from [batch, heads, seq, 2 * span] products (q . Kr^T, k . Qr^T), linear in seq.
"dense" then builds [batch, heads, seq, seq] scores (fast at short lengths); "blockwise" walks query blocks
(rematerialised under autodiff), so no [seq, seq] tensor is ever live and memory stays linear in seq; "pallas_gpu"
(bertjax.ops.pallas_gpu_disentangled) gathers the relative terms per tile inside a flash-attention kernel on GPU.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.ops.lazy import load_function
from bertjax.ops.platform_guard import KernelChoice, require_platform
from bertjax.ops.masks import attention_mask


def log_bucket(relative: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
    """DeBERTa-v2's log buckets of signed distances: exact within +-buckets // 2, logarithmic beyond, reaching
    +-(buckets - 1)... at max_position. Computed in float32 as transformers does, so ceil() lands on the same side."""
    relative = np.asarray(relative, np.int64)
    mid = buckets // 2
    sign = np.sign(relative)
    abs_pos = np.where((relative < mid) & (relative > -mid), mid - 1, np.abs(relative))
    ratio = np.log((abs_pos / np.float32(mid)).astype(np.float32)) / np.log(np.float32((max_position - 1) / mid))
    log_pos = np.ceil((ratio * np.float32(mid - 1)).astype(np.float32)) + mid
    return np.where(abs_pos <= mid, relative, log_pos * sign).astype(np.int64)


@functools.lru_cache(maxsize=32)
def relative_index(num_queries: int, num_keys: int, span: int, buckets: int, max_position: int) -> np.ndarray:
    """Row of the relative table for every distance d = i - j, as a vector indexed by d + num_keys - 1: clamped
    bucket + span, in [0, 2 * span). One entry per distance, so the table is linear in seq, not [seq, seq]."""
    distances = np.arange(-(num_keys - 1), num_queries)
    if buckets > 0:
        distances = log_bucket(distances, buckets, max_position)
    table = np.clip(distances + span, 0, 2 * span - 1).astype(np.int32)
    table.flags.writeable = False  # shared through the cache
    return table


def _tile_index(table: jax.Array, q_start, num_q: int, num_keys: int) -> jax.Array:
    """[num_q, num_keys] rows of the relative table for queries q_start.. against every key."""
    distance = (q_start + jnp.arange(num_q))[:, None] - jnp.arange(num_keys)[None, :]
    return jnp.take(table, distance + num_keys - 1, mode="clip")  # padded query rows past the end: masked anyway


def _scores(q, k, c2p, p2c, index, mask, scale):
    """Masked float32 scores [b, h, nq, nk] of query rows q [b, h, nq, d] against all keys k [b, h, nk, d]; c2p
    [b, h, nq, 2span] (those rows), p2c [b, h, nk, 2span] (all keys), index [nq, nk]."""
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
    if c2p is not None:
        s = s + jnp.take_along_axis(c2p, index[None, None], axis=-1)
    if p2c is not None:
        s = s + jnp.swapaxes(jnp.take_along_axis(p2c, index.T[None, None], axis=-1), -1, -2)
    s = s * scale
    return jnp.where(mask[:, None], s, jnp.finfo(jnp.float32).min)


def _attend(q, k, v, c2p, p2c, index, mask, scale):
    probs = jax.nn.softmax(_scores(q, k, c2p, p2c, index, mask, scale), axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", probs.astype(v.dtype), v)


def relative_products(q, k, pos_key, pos_query):
    """(q . Kr^T [b, h, seq, 2span] or None, k . Qr^T [b, h, seq, 2span] or None) of q, k [b, h, seq, d],
    accumulated in float32."""
    c2p = None if pos_key is None else jnp.einsum("bhqd,rhd->bhqr", q, pos_key, preferred_element_type=jnp.float32)
    p2c = None if pos_query is None else jnp.einsum("bhkd,rhd->bhkr", k, pos_query,
                                                    preferred_element_type=jnp.float32)
    return c2p, p2c


def dense_disentangled(q, k, v, pos_key, pos_query, *, segment_ids, table, scale, block_size=None,
                       interpret=False):
    """Reference path: the whole [b, h, seq, seq] score matrix at once. (interpret: Pallas only, ignored.)"""
    seq = q.shape[2]
    c2p, p2c = relative_products(q, k, pos_key, pos_query)
    index = _tile_index(table, 0, seq, seq)
    return _attend(q, k, v, c2p, p2c, index, attention_mask(segment_ids, segment_ids, None), scale)


def blockwise_disentangled(q, k, v, pos_key, pos_query, *, segment_ids, table, scale, block_size=128,
                           interpret=False):
    """Query blocks of `block_size` rows, one after another; each block sees every key (its scores are [b, h,
    block, seq]) and is rematerialised in the backward pass, so live memory is O(block * seq), not O(seq^2)."""
    batch, heads, seq, dim = q.shape
    blocks = -(-seq // block_size)
    pad = blocks * block_size - seq
    c2p, p2c = relative_products(q, k, pos_key, pos_query)
    # Padded query rows carry segment 0: masked everywhere, cut off at the end.
    q_pad = jnp.pad(q, ((0, 0), (0, 0), (0, pad), (0, 0)))
    seg_pad = jnp.pad(segment_ids, ((0, 0), (0, pad)))
    c2p_pad = None if c2p is None else jnp.pad(c2p, ((0, 0), (0, 0), (0, pad), (0, 0)))

    @jax.checkpoint
    def block(start):
        q_blk = jax.lax.dynamic_slice_in_dim(q_pad, start, block_size, axis=2)
        seg_blk = jax.lax.dynamic_slice_in_dim(seg_pad, start, block_size, axis=1)
        c2p_blk = None if c2p_pad is None else jax.lax.dynamic_slice_in_dim(c2p_pad, start, block_size, axis=2)
        index = _tile_index(table, start, block_size, seq)
        return _attend(q_blk, k, v, c2p_blk, p2c, index, attention_mask(seg_blk, segment_ids, None), scale)

    out = jax.lax.map(block, jnp.arange(blocks) * block_size)  # [blocks, b, h, block, d]
    out = jnp.moveaxis(out, 0, 2).reshape(batch, heads, blocks * block_size, dim)
    return out[:, :, :seq]


# implementation name -> function, or "module:function" for a backend's kernel (imported only when used, so the
# Triton-only module stays out of CPU and TPU programs). All take q, k, v [b, h, seq, d] and the same keywords.
IMPLEMENTATIONS = {
    "dense": dense_disentangled,
    "blockwise": blockwise_disentangled,
    "pallas_gpu": "bertjax.ops.pallas_gpu_disentangled:pallas_gpu_disentangled",
}
# The implementations that compile for some JAX platforms only (elsewhere: interpret mode); the rest run anywhere.
PLATFORMS = {"pallas_gpu": frozenset({"gpu"})}
# What "auto" runs on a JAX platform; a platform missing here takes the XLA path by length: dense up to
# 4 * block_size tokens (fast), blockwise beyond (memory linear in seq).
AUTO_BY_PLATFORM = {"gpu": "pallas_gpu"}


def resolve_implementation(implementation: str, seq: int, block_size: int, platform: str | None = None) -> str:
    """The IMPLEMENTATIONS name that serves a call ("auto" resolved for `platform`, default this backend)."""
    if implementation == "auto":
        by_length = "dense" if seq <= 4 * block_size else "blockwise"
        implementation = AUTO_BY_PLATFORM.get(platform or jax.default_backend(), by_length)
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"disentangled attention implementation {implementation!r} is unknown; known: "
                         f"{['auto', *sorted(IMPLEMENTATIONS)]}")
    return implementation


def _load(name: str):
    fn = IMPLEMENTATIONS[name]
    return load_function(fn) if isinstance(fn, str) else fn


def disentangled_attention(q, k, v, pos_key, pos_query, *, segment_ids, span: int, buckets: int, max_position: int,
                           implementation: str = "auto", block_size: int = 128, interpret: bool = False) -> jax.Array:
    """q, k, v [batch, seq, heads, head_dim]; pos_key / pos_query [2 * span, heads, head_dim] or None (term off).

    Returns [batch, seq, heads, head_dim]. Tokens attend within their segment (0 = padding). interpret: run a
    Pallas implementation in interpret mode (CPU tests)."""
    seq = q.shape[1]
    if not isinstance(seq, int):  # a `jax.export` polymorphic in seq: the relative table is built per length
        raise ValueError(f"disentangled attention needs a fixed sequence length, got the symbolic {seq}: its "
                         "relative-position table is built for each length, so export one function per length "
                         "(a symbolic batch size works)")
    implementation = resolve_implementation(implementation, seq, block_size)
    terms = 1 + (pos_key is not None) + (pos_query is not None)
    scale = 1.0 / float(np.sqrt(np.float32(q.shape[-1] * terms)))
    # numpy, not a jax array: under jit that would be a tracer, and the Pallas kernel sizes its band from the table.
    table = relative_index(seq, seq, span, buckets, max_position)
    # Heads ahead of the sequence for every contraction: XLA's CPU batched matmuls run several times slower with
    # the [batch, seq, heads, dim] layout (docs/benchmarks.md, model forward), and the relative products and
    # gathers then read contiguous [seq, 2 * span] rows per head.
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    if implementation in PLATFORMS:  # compiled elsewhere: an error naming the field (bertjax/ops/platform_guard.py)
        segment_ids = require_platform(segment_ids, KernelChoice.in_registry(
            "disentangled attention", implementation, PLATFORMS, IMPLEMENTATIONS, auto=True,
            fields="EncoderConfig.disentangled.implementation, or implementation= of "
                   "bertjax.ops.disentangled_attention.disentangled_attention",
            interpret="EncoderConfig.attention_interpret=True, or interpret=True"), interpret)
    out = _load(implementation)(q, k, v, pos_key, pos_query, segment_ids=segment_ids, table=table, scale=scale,
                                block_size=block_size, interpret=interpret)
    return jnp.swapaxes(out, 1, 2)
