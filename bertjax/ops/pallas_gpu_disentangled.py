"""DeBERTa's disentangled attention as a Pallas GPU (Triton) flash-attention kernel: the c2p / p2c terms are gathered
per tile inside the online-softmax loop, so no [batch, heads, seq, seq] tensor exists, forward or backward.

    score[i, j] = (q_i . k_j + c2p[i, idx(i - j)] + p2c[j, idx(i - j)]) * scale

c2p = q . Kr^T and p2c = k . Qr^T are the [seq, 2 * span] projected position tables per (batch, head), computed by
XLA outside the kernel (`relative_products`: linear in seq, and their gradients to q, k and the position
projections are XLA's). idx is the bucket row of a distance, read from the precomputed `relative_index` table
(one entry per distance, 2 * seq - 1 of them), so the log buckets are exactly those of the XLA paths.

Per tile (query block [i0, i0 + bq), key block [j0, j0 + bk)):
- forward and recomputation: the bias is a gather load c2p[i, idx] / p2c[j, idx] (Triton loads through a tensor
  of pointers; duplicates are harmless for loads);
- backward: the relative-table gradients are scatter-adds (many (i, j) of a row share a bucket once buckets clamp).
  Atomics would do, but Pallas' interpret mode drops duplicate updates, so the kernel never scatters: the distances
  of a tile span a band of bq + bk - 1 values and, the bucket function being monotone, their rows are a contiguous
  range [r0, r0 + band) (band = bq + bk - 1 rounded up, wider only where log buckets skip rows: `_row_band`).
  The tile's gradient in band coordinates, d[i, c] = sum_j ds[i, j] [idx(i, j) - r0 == c], is a one-hot
  reduction over a [bq, bk, 16] cube per 16 slots of the band, then a one-hot matmul [bq, 16] x [16, 2 * span]
  (bfloat16 on tensor cores, exact: `_place`) places those slots into the program's own [bq, 2 * span] accumulator
  (16 slots at a time keeps shared memory small: BACKWARD_TILE_AREA). dc2p rows belong to the dq program of their
  query block and dp2c rows to the dk/dv program of their key block, so each program writes its rows once, with no
  races. The backward tiles are 16 rows (BACKWARD_BLOCK): at 32 the accumulator alone takes 128 registers a thread.

Kernels, grids and block skipping are those of `pallas_gpu_attention` (no GQA, no window here: DeBERTa has
neither). Padding of sequence and head dimension, float32 / bfloat16 precision rules: as there.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from bertjax.ops.disentangled_attention import relative_products
from bertjax.ops.pallas_gpu_attention import (LOG2E, MASK_VALUE, _dot, _visible, check_offsets_fit, finish_softmax,
                                              key_block_ranges, online_softmax_step)
from bertjax.ops.per_device import ROWS, per_device

DEFAULT_BLOCK = 32  # forward tile side (the backward's is at most BACKWARD_BLOCK)
# The backward kernels' shared memory grows with the table width (2 * span rounded up) and the tile side: the
# [side, width] float32 accumulator and the one-hot placement [BAND_PART, width] go through it. Measured (triton 3.9
# for sm_90, head_dim 64, num_stages 2, the larger of dq and dk/dv; limit: the H100's 232,448 bytes per block):
# side 32 x width 512 (DeBERTa-v3's 256 buckets): bf16 59,780, f32 80,004; 32 x 1024: bf16 92,548, f32 112,772;
# 32 x 2048: bf16 158,084. (Placing the whole band at once, [band, width], took 164,228 / 184,452 at 32 x 512 and
# 315,524 at 32 x 1024.) So the backward tile side is at most BACKWARD_TILE_AREA // width: 32 up to width 1024,
# 16 at 2048; wider tables are refused. (Those figures predate BACKWARD_BLOCK and the bfloat16 placement, which
# need, bf16 / f32: 32,768 / 37,572 at 16 x 512; bf16 77,508 at 16 x 2048.)
BACKWARD_TILE_AREA = 32 * 1024
# The backward tile side is at most this (below the area limit): the [side, 2 * span] float32 accumulator is held in
# registers, 128 per thread at side 32 x 512 over 4 warps, which with the placement products made ptxas spill.
# Measured (bench.pallas_gpu_static --kernel deberta: DeBERTa-v3-base, bf16, 4 warps, num_stages 2, tensor-core
# placement; triton 3.9 for sm_90), stack bytes per thread dq / dk/dv: side 32: 12,360 / 12,432; side 16: 112 / 64
# (docs/benchmarks.md, "registers and spills").
BACKWARD_BLOCK = 16


@dataclasses.dataclass(frozen=True)
class _Static:
    """Compile-time settings of the three kernels (hashable: a custom_vjp non-differentiable argument)."""

    scale: float
    block_q: int
    block_k: int
    seq: int  # padded sequence length: the table holds 2 * seq - 1 distances
    c2p: bool
    p2c: bool
    interpret: bool
    num_warps: int
    num_stages: int
    band: int  # bucket rows one tile can touch (`_row_band`), a power of two for Triton's ranges
    backward_block: int = 0  # the backward tile side (BACKWARD_BLOCK, BACKWARD_TILE_AREA); 0: the table is too wide
    backward_band: int = 0  # `band` of a backward tile
    c2p_width: int = 0  # columns of the (padded) relative tables, for the error message


def _tile_index(table_ref, q_first, k_first, st: _Static):
    """[bq, bk] bucket rows idx(i - j) of one tile, and the band's first row r0 (the smallest: idx is monotone)."""
    shape = (st.block_q, st.block_k)
    rows = q_first + lax.broadcasted_iota(jnp.int32, shape, 0)
    cols = k_first + lax.broadcasted_iota(jnp.int32, shape, 1)
    index = table_ref[rows - cols + (st.seq - 1)]
    first = table_ref[q_first - (k_first + st.block_k - 1) + (st.seq - 1)]
    return rows, cols, index, first


def _scores(q, k, c2p_ref, p2c_ref, table_ref, b, h, q_first, k_first, st: _Static):
    """Scores of one tile in log2 units (content plus the gathered relative terms, times scale * LOG2E: the kernels
    exponentiate with exp2, as pallas_gpu_attention's); and the tile's bucket rows."""
    s = _dot(q, k, ((1,), (1,)))
    rows, cols, index, first = _tile_index(table_ref, q_first, k_first, st)
    if st.c2p:
        s = s + c2p_ref[b, h, rows, index]
    if st.p2c:
        s = s + p2c_ref[b, h, cols, index]
    return s * (st.scale * LOG2E), index, first


def _band_gradient(ds, index, first, st: _Static, axis: int, lo: int = 0, size: int | None = None):
    """[rows, size]: one tile's ds summed over `axis` (1: keys, for c2p rows; 0: queries, for p2c rows) into slot
    idx - r0 - lo of its bucket row (slots lo .. lo + size of the band), as a one-hot reduction over a
    [bq, bk, size] cube (no scatter, no atomics)."""
    size = st.band if size is None else size
    offset = index - first - lo  # slots [0, size) of this part of the band (`_row_band`)
    slot = lax.broadcasted_iota(jnp.int32, ds.shape + (size,), 2)
    return jnp.sum(jnp.where(offset[:, :, None] == slot, ds[:, :, None], 0.0), axis=axis)  # [rows, size]


def _place(d, first, width: int):
    """[rows, band] -> [rows, width]: column c goes to first + c, as a one-hot matmul (exact: one term per entry)."""
    band = d.shape[1]
    place = (lax.broadcasted_iota(jnp.int32, (band, width), 1)
             == first + lax.broadcasted_iota(jnp.int32, (band, width), 0)).astype(jnp.bfloat16)
    # A float32 product here runs on FMA units with both operands spread over the threads' registers (ptxas spilled
    # 5-7 KB per thread at 16- and 32-row tiles); bfloat16 runs on tensor cores. d is split into three bfloat16 pieces
    # that sum back to it exactly (8 + 8 + 8 significant bits of float32's 24), and each output entry has one
    # nonzero term per piece, so the placement stays exact.
    hi = d.astype(jnp.bfloat16)
    rest = d - hi.astype(jnp.float32)
    mid = rest.astype(jnp.bfloat16)
    lo = (rest - mid.astype(jnp.float32)).astype(jnp.bfloat16)
    return _dot(hi, place) + _dot(mid, place) + _dot(lo, place)


BAND_PART = 16  # band slots reduced and placed at a time: a [bq, bk, 16] cube instead of [bq, bk, band]


def _table_gradient(ds, index, first, st: _Static, axis: int, width: int):
    """[rows, width]: the tile's relative-table gradient, the band taken BAND_PART slots at a time so the one-hot
    cube stays small (the whole [32, 32, 64] float32 cube made ptxas spill ~50 KB per thread)."""
    part = min(BAND_PART, st.band)
    total = None
    for lo in range(0, st.band, part):
        placed = _place(_band_gradient(ds, index, first, st, axis, lo, part), first + lo, width)
        total = placed if total is None else total + placed
    return total


def _forward_kernel(lo_ref, hi_ref, seg_ref, table_ref, q_ref, k_ref, v_ref, c2p_ref, p2c_ref, o_ref, lse_ref, *,
                    st: _Static):
    b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    q_first = i * st.block_q
    q = q_ref[...]
    q_seg = seg_ref[b, pl.ds(q_first, st.block_q)]

    def step(j, carry):
        acc, m, l = carry
        k_first = j * st.block_k
        keys = pl.ds(k_first, st.block_k)
        k, v = k_ref[b, h, keys, :], v_ref[b, h, keys, :]
        mask = _visible(q_seg, seg_ref[b, keys], q_first, k_first, None)
        s, _, _ = _scores(q, k, c2p_ref, p2c_ref, table_ref, b, h, q_first, k_first, st)
        return online_softmax_step(acc, m, l, jnp.where(mask, s, MASK_VALUE), v)

    init = (jnp.zeros(q.shape, jnp.float32), jnp.full((st.block_q,), MASK_VALUE, jnp.float32),
            jnp.zeros((st.block_q,), jnp.float32))
    acc, m, l = lax.fori_loop(lo_ref[b, i], hi_ref[b, i], step, init)
    finish_softmax(acc, m, l, o_ref, lse_ref)


def _dq_kernel(lo_ref, hi_ref, seg_ref, table_ref, q_ref, do_ref, lse_ref, delta_ref, k_ref, v_ref, c2p_ref, p2c_ref,
               dq_ref, dc2p_ref, *, st: _Static):
    b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    q_first = i * st.block_q
    q, do = q_ref[...], do_ref[...]
    lse2, delta = lse_ref[...] * LOG2E, delta_ref[...]
    q_seg = seg_ref[b, pl.ds(q_first, st.block_q)]
    width = dc2p_ref.shape[-1]

    def step(j, carry):
        dq, dc2p = carry
        k_first = j * st.block_k
        keys = pl.ds(k_first, st.block_k)
        k, v = k_ref[b, h, keys, :], v_ref[b, h, keys, :]
        mask = _visible(q_seg, seg_ref[b, keys], q_first, k_first, None)
        s, index, first = _scores(q, k, c2p_ref, p2c_ref, table_ref, b, h, q_first, k_first, st)
        p = jnp.where(mask, jnp.exp2(s - lse2[:, None]), 0.0)
        ds = p * (_dot(do, v, ((1,), (1,))) - delta[:, None]) * st.scale  # d loss / d (unscaled score)
        if st.c2p:
            dc2p = dc2p + _table_gradient(ds, index, first, st, 1, width)
        return dq + _dot(ds.astype(k.dtype), k), dc2p

    init = (jnp.zeros(q.shape, jnp.float32), jnp.zeros((st.block_q, width), jnp.float32))
    dq, dc2p = lax.fori_loop(lo_ref[b, i], hi_ref[b, i], step, init)
    dq_ref[...] = dq.astype(dq_ref.dtype)
    dc2p_ref[...] = dc2p


def _dkv_kernel(lo_ref, hi_ref, seg_ref, table_ref, k_ref, v_ref, q_ref, do_ref, lse_ref, delta_ref, c2p_ref,
                p2c_ref, dk_ref, dv_ref, dp2c_ref, *, st: _Static):
    b, h, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    k_first = j * st.block_k
    k, v = k_ref[...], v_ref[...]
    k_seg = seg_ref[b, pl.ds(k_first, st.block_k)]
    width = dp2c_ref.shape[-1]

    def step(i, carry):
        dk, dv, dp2c = carry
        q_first = i * st.block_q
        queries = pl.ds(q_first, st.block_q)
        q, do = q_ref[b, h, queries, :], do_ref[b, h, queries, :]
        mask = _visible(seg_ref[b, queries], k_seg, q_first, k_first, None)
        s, index, first = _scores(q, k, c2p_ref, p2c_ref, table_ref, b, h, q_first, k_first, st)
        p = jnp.where(mask, jnp.exp2(s - (lse_ref[b, h, queries] * LOG2E)[:, None]), 0.0)
        dv = dv + _dot(p.astype(do.dtype), do, ((0,), (0,)))
        ds = p * (_dot(do, v, ((1,), (1,))) - delta_ref[b, h, queries][:, None]) * st.scale
        if st.p2c:
            dp2c = dp2c + _table_gradient(ds, index, first, st, 0, width)
        return dk + _dot(ds.astype(q.dtype), q, ((0,), (0,))), dv, dp2c

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv, dp2c = lax.fori_loop(lo_ref[b, j], hi_ref[b, j], step,
                                 (zeros, zeros, jnp.zeros((st.block_k, width), jnp.float32)))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)
    dp2c_ref[...] = dp2c


def _compiler_params(st: _Static):
    if st.interpret:
        return None
    from jax.experimental.pallas import triton as pl_triton  # GPU-only module; interpret mode does not need it
    return pl_triton.CompilerParams(num_warps=st.num_warps, num_stages=st.num_stages)


def _call(kernel, name, grid, in_specs, out_specs, out_shape, st: _Static):
    return pl.pallas_call(functools.partial(kernel, st=st), grid=grid, in_specs=in_specs, out_specs=out_specs,
                          out_shape=out_shape, compiler_params=_compiler_params(st), interpret=st.interpret,
                          name=name)


def _forward(q, k, v, c2p, p2c, seg, table, st: _Static):
    batch, heads, seq, dim = q.shape
    lo, hi = key_block_ranges(seg, None, st.block_q, st.block_k)
    whole = pl.no_block_spec
    q_block = pl.BlockSpec((None, None, st.block_q, dim), lambda b, h, i: (b, h, i, 0))
    row_block = pl.BlockSpec((None, None, st.block_q), lambda b, h, i: (b, h, i))
    return _call(_forward_kernel, "bertjax_disentangled_forward", (batch, heads, seq // st.block_q),
                 [whole, whole, whole, whole, q_block, whole, whole, whole, whole], [q_block, row_block],
                 [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32)],
                 st)(lo, hi, seg, table, q, k, v, c2p, p2c)


def _backward(q, k, v, c2p, p2c, seg, table, out, lse, do, st: _Static):
    batch, heads, seq, dim = q.shape
    # An absent term's gradient output is a token 16 columns wide (never read): no [seq, 2 * span] of zeros.
    c2p_width = c2p.shape[-1] if st.c2p else 16
    p2c_width = p2c.shape[-1] if st.p2c else 16
    delta = jnp.einsum("bhsd,bhsd->bhs", do.astype(jnp.float32), out.astype(jnp.float32))
    whole = pl.no_block_spec
    lo, hi = key_block_ranges(seg, None, st.block_q, st.block_k)
    q_block = pl.BlockSpec((None, None, st.block_q, dim), lambda b, h, i: (b, h, i, 0))
    row_block = pl.BlockSpec((None, None, st.block_q), lambda b, h, i: (b, h, i))
    rel_q_block = pl.BlockSpec((None, None, st.block_q, c2p_width), lambda b, h, i: (b, h, i, 0))
    dq, dc2p = _call(_dq_kernel, "bertjax_disentangled_dq", (batch, heads, seq // st.block_q),
                     [whole, whole, whole, whole, q_block, q_block, row_block, row_block, whole, whole, whole, whole],
                     [q_block, rel_q_block],
                     [jax.ShapeDtypeStruct(q.shape, q.dtype),
                      jax.ShapeDtypeStruct((batch, heads, seq, c2p_width), jnp.float32)],
                     st)(lo, hi, seg, table, q, do, lse, delta, k, v, c2p, p2c)

    k_lo, k_hi = key_block_ranges(seg, None, st.block_k, st.block_q)  # visibility is symmetric
    k_block = pl.BlockSpec((None, None, st.block_k, dim), lambda b, h, j: (b, h, j, 0))
    rel_k_block = pl.BlockSpec((None, None, st.block_k, p2c_width), lambda b, h, j: (b, h, j, 0))
    dk, dv, dp2c = _call(_dkv_kernel, "bertjax_disentangled_dkv", (batch, heads, seq // st.block_k),
                         [whole, whole, whole, whole, k_block, k_block, whole, whole, whole, whole, whole, whole],
                         [k_block, k_block, rel_k_block],
                         [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype),
                          jax.ShapeDtypeStruct((batch, heads, seq, p2c_width), jnp.float32)],
                         st)(k_lo, k_hi, seg, table, k, v, q, do, lse, delta, c2p, p2c)
    # An absent term was passed as a dummy operand: its "gradient" is zeros of the dummy's shape.
    dc2p = dc2p if st.c2p else jnp.zeros_like(c2p)
    dp2c = dp2c if st.p2c else jnp.zeros_like(p2c)
    return dq, dk, dv, dc2p, dp2c


def _concrete(table) -> np.ndarray:
    try:
        return np.asarray(table, np.int32)
    except jax.errors.TracerArrayConversionError:
        raise ValueError("pallas_gpu disentangled attention: `table` must be concrete (relative_index's numpy "
                         "table), not traced: the kernel's band width is computed from it") from None


def backward_tile(block: int, width: int) -> int:
    """The backward kernels' tile side: the largest power of two <= min(block, BACKWARD_BLOCK) with side x width <=
    BACKWARD_TILE_AREA, or 0 where that is under 16 (Triton's smallest dot)."""
    side = min(block, BACKWARD_BLOCK, pl.next_power_of_2(BACKWARD_TILE_AREA // width + 1) // 2)
    return side if side >= 16 else 0


def _row_band(table: np.ndarray, distances: int) -> int:
    """How many consecutive bucket rows `distances` consecutive distances can reach (the table is monotone), as a
    power of two. Usually the distance count itself; more where log buckets step by more than one row per distance
    (max_relative_positions barely above position_buckets // 2), never more than the table has rows."""
    if np.any(np.diff(table) < 0):
        raise ValueError("pallas_gpu disentangled attention: the relative index table must be non-decreasing")
    window = min(distances, len(table))
    reach = int(np.max(table[window - 1:] - table[:len(table) - window + 1])) + 1
    return pl.next_power_of_2(max(reach, 16))


@functools.partial(jax.custom_vjp, nondiff_argnums=(7,))
def _flash(q, k, v, c2p, p2c, seg, table, st: _Static):
    return _forward(q, k, v, c2p, p2c, seg, table, st)[0]


def _flash_fwd(q, k, v, c2p, p2c, seg, table, st: _Static):
    out, lse = _forward(q, k, v, c2p, p2c, seg, table, st)
    return out, (q, k, v, c2p, p2c, seg, table, out, lse)


def _flash_bwd(st: _Static, residuals, do):
    q, k, v, c2p, p2c, seg, table, out, lse = residuals
    if not st.backward_block:
        raise ValueError(f"pallas_gpu disentangled attention: the gradient of a relative table {st.c2p_width} wide "
                         f"(2 * span) needs tiles under 16 rows to fit a GPU's shared memory; train with "
                         f"implementation='blockwise' (the forward pass works)")
    # Smaller tiles than the forward's (BACKWARD_BLOCK, BACKWARD_TILE_AREA); the forward's log-sum-exp is
    # per row, so it serves any tiling.
    backward = dataclasses.replace(st, block_q=st.backward_block, block_k=st.backward_block, band=st.backward_band)
    return (*_backward(q, k, v, c2p, p2c, seg, table, out, lse, do, backward), None, None)  # integer operands


_flash.defvjp(_flash_fwd, _flash_bwd)


def pallas_gpu_disentangled(q, k, v, pos_key, pos_query, *, segment_ids, table, scale, block_size=DEFAULT_BLOCK,
                            interpret=False, num_warps: int | None = None, num_stages: int = 2):
    """q, k, v [batch, heads, seq, head_dim] (the layout `disentangled_attention` hands its implementations),
    pos_key / pos_query [2 * span, heads, head_dim] or None, table the `relative_index` of this seq.

    `block_size` caps the tile side (a power of two; at most DEFAULT_BLOCK is used: the backward's one-hot cube
    grows with its cube)."""
    block = min(int(block_size), DEFAULT_BLOCK)
    if block < 16 or block & (block - 1):
        raise ValueError(f"pallas_gpu disentangled attention: block_size must be a power of two >= 16, got "
                         f"{block_size}")
    table = _concrete(table)

    def kernel(q, k, v, pos_key, pos_query, segment_ids):  # one device's shard of batch (and heads)
        return _disentangled(q, k, v, pos_key, pos_query, segment_ids, table=table, scale=scale, block=block,
                             interpret=interpret, num_warps=num_warps, num_stages=num_stages)

    # Under a mesh, per device in a shard_map: XLA would replicate the Triton calls (gathering q, k, v everywhere).
    heads_first = ("batch", "heads", None, None)  # [batch, heads, seq, head_dim]
    positions = (None, "heads", None)  # [2 * span, heads, head_dim]
    return per_device(kernel, (q, k, v, pos_key, pos_query, segment_ids),
                      (heads_first, heads_first, heads_first, positions, positions, ROWS), heads_first,
                      batch=q.shape[0], heads=q.shape[1])


def _disentangled(q, k, v, pos_key, pos_query, segment_ids, *, table, scale, block, interpret, num_warps,
                  num_stages):
    batch, heads, seq, head_dim = q.shape
    c2p, p2c = relative_products(q, k, pos_key, pos_query)
    padded = -(-seq // block) * block
    tail = padded - seq
    padded_dim = max(16, pl.next_power_of_2(head_dim))
    rows = next((x.shape[0] for x in (pos_key, pos_query) if x is not None), 1)  # 2 * span; neither: content only
    width = max(16, pl.next_power_of_2(rows))

    def pad(x, last):
        widths = ((0, 0), (0, 0), (0, tail), (0, last - x.shape[-1]))
        return jnp.pad(x, widths) if any(w for _, w in widths) else x

    dummy = jnp.zeros((1, 1, 1, 1), jnp.float32)  # an absent term: never read
    c2p = dummy if c2p is None else pad(c2p, width)
    p2c = dummy if p2c is None else pad(p2c, width)
    check_offsets_fit("pallas_gpu disentangled attention", interpret, q=q, c2p=c2p, p2c=p2c)
    # Padded rows and keys are masked; the edge values keep their table reads inside [0, 2 * span).
    table = np.pad(table, (tail, tail), mode="edge")
    band = _row_band(table, 2 * block - 1)
    backward_block = backward_tile(block, width)
    seg = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, tail)))
    st = _Static(scale=float(scale), block_q=block, block_k=block, seq=padded, c2p=pos_key is not None,
                 p2c=pos_query is not None, interpret=bool(interpret),
                 num_warps=num_warps or (4 if padded_dim <= 64 else 8), num_stages=num_stages, band=band,
                 backward_block=backward_block, c2p_width=width,
                 backward_band=_row_band(table, 2 * backward_block - 1) if backward_block else 0)
    out = _flash(pad(q, padded_dim), pad(k, padded_dim), pad(v, padded_dim), c2p, p2c, seg, jnp.asarray(table), st)
    return out[:, :, :seq, :head_dim]
