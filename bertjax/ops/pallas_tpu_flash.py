"""bertjax's own Pallas TPU (Mosaic) flash attention, for what splash attention cannot express: ALiBi and the
log-sum-exp that merges a local layer with Longformer's global keys.

Splash (pallas_tpu_attention.py) stays the path for plain, windowed and GQA attention. It takes a mask, never an
additive bias, and does not return its log-sum-exp to a differentiable caller; MosaicBERT (ALiBi on every layer) and
Longformer (window + global tokens) need both. This file implements FlashAttention-2 with three kernels, in the
heads-leading layout [batch, heads, seq, head_dim] that Mosaic tiles as (rows, head_dim):

- forward: grid (batch, heads, query blocks, key steps); online softmax in VMEM scratch, output and log-sum-exp;
- dq: the same grid, accumulates dq over key steps;
- dk/dv: grid (batch, kv_heads, key blocks, group * query steps), scores transposed ([keys, queries]) so the
  per-query log-sum-exp and delta are rows that broadcast over sublanes; GQA never repeats k or v in memory.

Block skipping: the last grid axis is not "every key block" but at most `steps` blocks starting at the first
visible one (`key_block_ranges`, shared with the GPU kernel: window and segment spans). For a local layer `steps`
is a static bound from the window alone, so the grid itself is O(seq * window); blocks beyond a row's range (packing,
padding) are clamped in the index_map to the last visible block (Mosaic does not re-fetch an unchanged block) and
their compute is skipped with pl.when. The ALiBi bias -slope_h * |i - j| is built per tile from iota positions and
the head's slope (scalar-prefetched into SMEM); nothing [seq, seq] exists.

Mosaic tiling: the sequence is padded to a block multiple (padding: segment id 0); blocks are multiples of 128 on
TPU (query segment ids are lane-replicated [seq, 128], key segment ids sublane-replicated [8, seq], the
log-sum-exp and delta are [1, seq] rows per head); head_dim is always a whole block dimension. A query with no
visible key (padding) returns zeros and zero gradients. bfloat16 inputs multiply in bfloat16, accumulate in float32.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from bertjax.ops.global_tokens import attention_with_lse, merge_global_tokens
from bertjax.ops.pallas_gpu_attention import key_block_ranges

LANES, SUBLANES = 128, 8
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
DEFAULT_BLOCK = 256  # window 128..512: 256-row tiles visit ~2x the window's keys; global layers gain little from 512


@dataclasses.dataclass(frozen=True)
class _Static:
    """Compile-time settings of the three kernels (hashable: a custom_vjp non-differentiable argument)."""

    scale: float
    half: int | None  # local_window // 2, or None for global attention
    block_q: int
    block_k: int
    alibi: bool
    interpret: bool


def _steps(st: _Static, seq: int, rows: int, cols: int) -> int:
    """Static bound on the blocks of `cols` rows one block of `rows` rows may see (the grid's last axis)."""
    total = seq // cols
    if st.half is None:
        return total
    span = rows + 2 * st.half  # positions a block can reach through the window
    return min(total, -(-(span - 1) // cols) + 1)


def _dot(a, b, contract):
    return lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32)


_NT = ((1,), (1,))  # a @ b.T
_NN = ((1,), (0,))  # a @ b


def _tile_scores(st: _Static, rows, cols, slope, row_first, col_first, row_seg, col_seg, rows_are_queries: bool):
    """Scaled scores of one tile (rows x cols), plus ALiBi, with the visibility mask.

    row_seg is a [rows, 1]-broadcastable column, col_seg a [1, cols] row. When the rows are keys (the dk/dv kernel's
    transposed tile), padding is tested on the query side (the columns)."""
    s = _dot(rows, cols, _NT) * st.scale
    shape = s.shape
    if st.alibi or st.half is not None:
        distance = jnp.abs((row_first + lax.broadcasted_iota(jnp.int32, shape, 0))
                           - (col_first + lax.broadcasted_iota(jnp.int32, shape, 1)))
    if st.alibi:
        s = s - slope * distance.astype(jnp.float32)
    query_seg = row_seg if rows_are_queries else col_seg
    mask = (row_seg == col_seg) & (query_seg != 0)
    if st.half is not None:
        mask = mask & (distance <= st.half)
    return s, mask


def _block_index(lo_ref, hi_ref, n, t):
    """The t-th visible block of range n, clamped to the last visible one (an unchanged block is not re-fetched)."""
    lo, hi = lo_ref[n], hi_ref[n]
    return jnp.minimum(lo + t, jnp.maximum(hi - 1, lo))


def _forward_kernel(lo_ref, hi_ref, slopes_ref, q_ref, k_ref, v_ref, qseg_ref, kseg_ref, o_ref, lse_ref,
                    m_scr, l_scr, acc_scr, *, st: _Static, num_q: int, steps: int):
    b, h, i, t = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)
    n = b * num_q + i

    @pl.when(t == 0)
    def _init():
        m_scr[...] = jnp.full(m_scr.shape, MASK_VALUE, jnp.float32)
        l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when(lo_ref[n] + t < hi_ref[n])
    def _step():
        j = lo_ref[n] + t
        v = v_ref[...]
        s, mask = _tile_scores(st, q_ref[...], k_ref[...], slopes_ref[h], i * st.block_q, j * st.block_k,
                               qseg_ref[:, :1], kseg_ref[:1, :], rows_are_queries=True)
        s = jnp.where(mask, s, MASK_VALUE)
        m_prev = m_scr[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))  # [block_q, LANES]
        # A row with nothing visible yet has s == m_new == MASK_VALUE: exp(0) = 1, hence the explicit zero.
        p = jnp.where(mask, jnp.exp(s - m_new[:, :1]), 0.0)
        alpha = jnp.exp(m_prev - m_new)
        l_scr[...] = alpha * l_scr[...] + jnp.sum(p, axis=1, keepdims=True)
        acc_scr[...] = acc_scr[...] * alpha[:, :1] + _dot(p.astype(v.dtype), v, _NN)
        m_scr[...] = m_new

    @pl.when(t == steps - 1)
    def _finish():
        l = l_scr[...]
        empty = l == 0.0  # no visible key: output 0, and a log-sum-exp the backward pass never uses
        safe = jnp.where(empty, 1.0, l)
        o_ref[...] = (acc_scr[...] / safe[:, :1]).astype(o_ref.dtype)
        lse = jnp.where(empty, 0.0, m_scr[...] + jnp.log(safe))  # [block_q, LANES], lanes equal
        lse_ref[...] = lse.T[:1, :]  # a [1, block_q] row


def _dq_kernel(lo_ref, hi_ref, slopes_ref, q_ref, do_ref, lse_ref, delta_ref, k_ref, v_ref, qseg_ref, kseg_ref,
               dq_ref, lse_scr, delta_scr, acc_scr, *, st: _Static, num_q: int, steps: int):
    b, h, i, t = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)
    n = b * num_q + i

    @pl.when(t == 0)
    def _init():
        # The [1, block_q] rows become lane-replicated columns once per query block.
        lse_scr[...] = jnp.broadcast_to(lse_ref[...], (LANES, st.block_q)).T
        delta_scr[...] = jnp.broadcast_to(delta_ref[...], (LANES, st.block_q)).T
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when(lo_ref[n] + t < hi_ref[n])
    def _step():
        j = lo_ref[n] + t
        k, v, do = k_ref[...], v_ref[...], do_ref[...]
        s, mask = _tile_scores(st, q_ref[...], k, slopes_ref[h], i * st.block_q, j * st.block_k,
                               qseg_ref[:, :1], kseg_ref[:1, :], rows_are_queries=True)
        p = jnp.where(mask, jnp.exp(s - lse_scr[:, :1]), 0.0)
        ds = p * (_dot(do, v, _NT) - delta_scr[:, :1])
        acc_scr[...] += _dot(ds.astype(k.dtype), k, _NN)

    @pl.when(t == steps - 1)
    def _finish():
        dq_ref[...] = (acc_scr[...] * st.scale).astype(dq_ref.dtype)


def _dkv_kernel(lo_ref, hi_ref, slopes_ref, k_ref, v_ref, q_ref, do_ref, lse_ref, delta_ref, kseg_ref, qseg_ref,
                dk_ref, dv_ref, dk_scr, dv_scr, *, st: _Static, num_k: int, steps: int, group: int):
    b, g, j, t = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)
    n = b * num_k + j
    h = g * group + t // steps
    u = t % steps

    @pl.when(t == 0)
    def _init():
        dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
        dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

    @pl.when(lo_ref[n] + u < hi_ref[n])
    def _step():
        i = lo_ref[n] + u
        q, do, v = q_ref[...], do_ref[...], v_ref[...]
        # Transposed tile [block_k, block_q]: the query statistics are [1, block_q] rows.
        s, mask = _tile_scores(st, k_ref[...], q, slopes_ref[h], j * st.block_k, i * st.block_q,
                               kseg_ref[:, :1], qseg_ref[:1, :], rows_are_queries=False)
        p = jnp.where(mask, jnp.exp(s - lse_ref[...]), 0.0)
        dv_scr[...] += _dot(p.astype(do.dtype), do, _NN)
        ds = p * (_dot(v, do, _NT) - delta_ref[...])
        dk_scr[...] += _dot(ds.astype(q.dtype), q, _NN)

    @pl.when(t == group * steps - 1)
    def _finish():
        dk_ref[...] = (dk_scr[...] * st.scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)


# The last grid axis carries the online-softmax / gradient accumulators in scratch: it must run in order.
_PARAMS = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))


def _segment_layouts(seg):
    """Segment ids [batch, seq] as lane-replicated columns [batch, seq, LANES] and sublane-replicated rows
    [batch, SUBLANES, seq]: the shapes Mosaic tiles without relayout (as splash attention does)."""
    batch, seq = seg.shape
    return (jnp.broadcast_to(seg[:, :, None], (batch, seq, LANES)),
            jnp.broadcast_to(seg[:, None, :], (batch, SUBLANES, seq)))


def _ranges(seg, st: _Static, rows: int, cols: int):
    lo, hi = key_block_ranges(seg, None if st.half is None else 2 * st.half, rows, cols)
    return lo.reshape(-1), hi.reshape(-1)


def _forward(q, k, v, seg, slopes, st: _Static):
    batch, heads, seq, dim = q.shape
    group = heads // k.shape[1]
    num_q = seq // st.block_q
    steps = _steps(st, seq, st.block_q, st.block_k)
    lo, hi = _ranges(seg, st, st.block_q, st.block_k)
    q_cols, k_rows = _segment_layouts(seg)

    def kv_index(b, h, i, t, lo, hi, slopes):
        return b, h // group, _block_index(lo, hi, b * num_q + i, t), 0

    def kseg_index(b, h, i, t, lo, hi, slopes):
        return b, 0, _block_index(lo, hi, b * num_q + i, t)

    q_block = pl.BlockSpec((None, None, st.block_q, dim), lambda b, h, i, t, *_: (b, h, i, 0))
    kv_block = pl.BlockSpec((None, None, st.block_k, dim), kv_index)
    row = pl.BlockSpec((None, None, 1, st.block_q), lambda b, h, i, t, *_: (b, h, 0, i))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3, grid=(batch, heads, num_q, steps),
        in_specs=[q_block, kv_block, kv_block,
                  pl.BlockSpec((None, st.block_q, LANES), lambda b, h, i, t, *_: (b, i, 0)),
                  pl.BlockSpec((None, SUBLANES, st.block_k), kseg_index)],
        out_specs=[q_block, row],
        scratch_shapes=[pltpu.VMEM((st.block_q, LANES), jnp.float32), pltpu.VMEM((st.block_q, LANES), jnp.float32),
                        pltpu.VMEM((st.block_q, dim), jnp.float32)])
    out, lse = pl.pallas_call(
        functools.partial(_forward_kernel, st=st, num_q=num_q, steps=steps), grid_spec=grid_spec,
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, 1, seq), jnp.float32)],
        compiler_params=_PARAMS, interpret=st.interpret, name="bertjax_tpu_flash_forward",
    )(lo, hi, slopes, q, k, v, q_cols, k_rows)
    return out, lse[:, :, 0]


def _backward(q, k, v, seg, slopes, out, lse, do, st: _Static, dlse=None):
    batch, heads, seq, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    # delta_i = sum_d dO_id O_id, the softmax-backward row term; a log-sum-exp cotangent g enters as delta - g.
    delta = jnp.einsum("bhsd,bhsd->bhs", do.astype(jnp.float32), out.astype(jnp.float32))
    if dlse is not None:
        delta = delta - dlse
    lse_rows, delta_rows = lse[:, :, None, :], delta[:, :, None, :]
    q_cols, k_rows = _segment_layouts(seg)
    num_q, num_k = seq // st.block_q, seq // st.block_k

    steps = _steps(st, seq, st.block_q, st.block_k)
    lo, hi = _ranges(seg, st, st.block_q, st.block_k)

    def kv_index(b, h, i, t, lo, hi, slopes):
        return b, h // group, _block_index(lo, hi, b * num_q + i, t), 0

    def kseg_index(b, h, i, t, lo, hi, slopes):
        return b, 0, _block_index(lo, hi, b * num_q + i, t)

    q_block = pl.BlockSpec((None, None, st.block_q, dim), lambda b, h, i, t, *_: (b, h, i, 0))
    q_row = pl.BlockSpec((None, None, 1, st.block_q), lambda b, h, i, t, *_: (b, h, 0, i))
    kv_block = pl.BlockSpec((None, None, st.block_k, dim), kv_index)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, st=st, num_q=num_q, steps=steps),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3, grid=(batch, heads, num_q, steps),
            in_specs=[q_block, q_block, q_row, q_row, kv_block, kv_block,
                      pl.BlockSpec((None, st.block_q, LANES), lambda b, h, i, t, *_: (b, i, 0)),
                      pl.BlockSpec((None, SUBLANES, st.block_k), kseg_index)],
            out_specs=q_block,
            scratch_shapes=[pltpu.VMEM((st.block_q, LANES), jnp.float32),
                            pltpu.VMEM((st.block_q, LANES), jnp.float32),
                            pltpu.VMEM((st.block_q, dim), jnp.float32)]),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=_PARAMS, interpret=st.interpret, name="bertjax_tpu_flash_dq",
    )(lo, hi, slopes, q, do, lse_rows, delta_rows, k, v, q_cols, k_rows)

    # The visibility rule is symmetric: the query-block range of a key block is the same function transposed.
    q_steps = _steps(st, seq, st.block_k, st.block_q)
    k_lo, k_hi = _ranges(seg, st, st.block_k, st.block_q)

    def head(g, t):
        return g * group + t // q_steps

    def q_index(b, g, j, t, lo, hi, slopes):
        return b, head(g, t), _block_index(lo, hi, b * num_k + j, t % q_steps), 0

    def q_row_index(b, g, j, t, lo, hi, slopes):
        return b, head(g, t), 0, _block_index(lo, hi, b * num_k + j, t % q_steps)

    def qseg_index(b, g, j, t, lo, hi, slopes):
        return b, 0, _block_index(lo, hi, b * num_k + j, t % q_steps)

    k_block = pl.BlockSpec((None, None, st.block_k, dim), lambda b, g, j, t, *_: (b, g, j, 0))
    q_tile = pl.BlockSpec((None, None, st.block_q, dim), q_index)
    q_stat = pl.BlockSpec((None, None, 1, st.block_q), q_row_index)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, st=st, num_k=num_k, steps=q_steps, group=group),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=3, grid=(batch, kv_heads, num_k, group * q_steps),
            in_specs=[k_block, k_block, q_tile, q_tile, q_stat, q_stat,
                      pl.BlockSpec((None, st.block_k, LANES), lambda b, g, j, t, *_: (b, j, 0)),
                      pl.BlockSpec((None, SUBLANES, st.block_q), qseg_index)],
            out_specs=[k_block, k_block],
            scratch_shapes=[pltpu.VMEM((st.block_k, dim), jnp.float32), pltpu.VMEM((st.block_k, dim), jnp.float32)]),
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=_PARAMS, interpret=st.interpret, name="bertjax_tpu_flash_dkv",
    )(k_lo, k_hi, slopes, k, v, q, do, lse_rows, delta_rows, q_cols, k_rows)
    return dq, dk, dv


# (out [batch, heads, seq, dim], lse [batch, heads, seq]) in the kernel layout; differentiable in q, k, v including
# through lse (the Longformer merge with global keys needs that).
flash_attention_lse = attention_with_lse(_forward, _backward)


def _block_size(seq: int, block: int | None, interpret: bool) -> int:
    block = block or DEFAULT_BLOCK
    if not interpret and block % LANES:
        raise ValueError(f"pallas_tpu flash attention: block sizes must be multiples of {LANES} on TPU, got {block}")
    if block < 1 or block & (block - 1):
        raise ValueError(f"pallas_tpu flash attention: block sizes must be powers of two, got {block}")
    # Short sequences: one tile of the padded length, not a mostly-padding default tile.
    return min(block, -(-seq // LANES) * LANES) if block >= LANES else block


def tpu_flash_attention(q, k, v, *, segment_ids, local_window, scale, interpret=False, alibi_slopes=None,
                        global_tokens=None, global_slots=None, block_q: int | None = None,
                        block_k: int | None = None):
    """Flash attention with ALiBi and global tokens on TPU (or CPU, interpret=True). Shapes and meaning as
    `bertjax.ops.attention`; block_q/block_k override the tiles (powers of two; multiples of 128 on TPU)."""
    batch, seq, heads, dim = q.shape
    block_q, block_k = _block_size(seq, block_q, interpret), _block_size(seq, block_k, interpret)
    padded = -(-seq // max(block_q, block_k)) * max(block_q, block_k)
    tail = padded - seq
    st = _Static(scale=float(scale), half=None if local_window is None else local_window // 2, block_q=block_q,
                 block_k=block_k, alibi=alibi_slopes is not None, interpret=bool(interpret))
    slopes = (jnp.zeros((heads,), jnp.float32) if alibi_slopes is None
              else jnp.asarray(alibi_slopes, jnp.float32))
    seg = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, tail)))

    def to_kernel(x):  # [batch, seq, heads, dim] -> [batch, heads, padded, dim]
        return jnp.pad(x, ((0, 0), (0, tail), (0, 0), (0, 0))).transpose(0, 2, 1, 3)

    def local(q, k, v):  # [batch, seq, heads, dim] in and out, lse [batch, heads, seq]
        out, lse = flash_attention_lse(to_kernel(q), to_kernel(k), to_kernel(v), seg, slopes, st)
        return out.transpose(0, 2, 1, 3)[:, :seq], lse[:, :, :seq]

    if global_tokens is None or st.half is None:  # a global layer already sees every global token
        return local(q, k, v)[0]
    return merge_global_tokens(q, k, v, segment_ids.astype(jnp.int32), global_tokens, global_slots,
                               scale=st.scale, half=st.half, slopes=alibi_slopes, local=local)
