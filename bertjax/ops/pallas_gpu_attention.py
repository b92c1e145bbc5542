"""bertjax's own Pallas GPU (Triton) flash attention: bidirectional sliding window, packed segments, GQA.

Nothing in JAX covers this on GPU (JAX's Pallas GPU attention has no window and mishandles GQA; cuDNN rejects a
bidirectional window), so this file implements FlashAttention-2 with three kernels:

- forward: grid (batch, heads, query blocks); each program keeps one query block on chip and streams key/value
  blocks through an online softmax, saving the log-sum-exp for the backward pass;
- dq: same grid, streams key blocks again and accumulates dq;
- dk/dv: grid (batch, kv_heads, key blocks); streams the query blocks of every query head sharing that kv head, so
  GQA never repeats k or v in memory and dk/dv need no cross-program reduction. It works on transposed tiles
  ([keys, queries]: s^T = k q^T), so that every product's rows are the keys it holds and p^T and ds^T feed the
  next products as they are, where [queries, keys] tiles would be transposed on chip (through shared memory)
  before dv += p^T dO and dk += ds^T q.

Each kernel may tile and launch differently (`backward_block_q`, ... for dq, `dkv_block_q`, ... for dk/dv): the
forward's log-sum-exp is per query row, so any tiling can reuse it, and the kernels' needs differ: a forward or dq
program holds one float32 accumulator [block_q, head_dim], a dk/dv program two ([block_k, head_dim] each) plus its
k and v tiles, which is what pushes dk/dv to the register limit first. Each program wants its held rows many (the
products' M side) and its streamed ones few, and dq holds queries where dk/dv holds keys, so one tiling cannot suit
both. By default every kernel still uses the forward's settings: which others run faster is for a GPU to time
(docs/benchmarks.md, "Backward tiles: registers and spills").

Softmax in base 2: scores are scaled by scale * log2(e) and exponentiated with exp2, which is one multi-function
unit instruction on NVIDIA GPUs, where exp (float32) lowers to libdevice's accurate expf, several instructions per
element; at head_dim 64 a score costs 256 FLOPs of tile products and one exponential, and an H100's special-function
units are ~256x slower than its tensor cores, so the exponentials take as long as the products (FlashAttention-3's
observation). The log-sum-exp that leaves the kernel is natural.

Block skipping: each program loops only over the contiguous range of blocks that `key_block_ranges` returns. It
keeps a key block when it intersects the window of the query block and the range [min, max] of the non-padding
segment ids of both blocks overlap. Blocks outside the range are never loaded. For packed rows (segment ids
non-decreasing along the row, padding at the end) the range is exactly the set of blocks holding a visible key, so
local attention does O(seq * window) work and a query block made only of padding does none. The same function
gives the dk/dv kernel its query-block ranges: the visibility rule is symmetric.

Inside that range, the tiles whose every (query, key) pair is visible (one document covers both blocks, and the
window covers every pair) form the sub-range `full_block_ranges` returns; the loops split in three there and the
middle one computes no mask at all (for a global layer over long documents, almost every tile).

Any sequence length works: the wrapper pads the sequence to a block multiple (padding gets segment id 0) and the
head dimension to a power of two >= 16 (Triton's dot needs it), and slices the result. A query row with no visible
key (padding) returns zeros and gets zero gradients; nothing divides by zero, so no NaN appears.
float32 inputs use full-precision matmuls (so tests can be tight); bfloat16 inputs multiply in bfloat16 and
accumulate in float32.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from bertjax.ops.global_tokens import attention_with_lse, merge_global_tokens
from bertjax.ops.lazy import load_function
from bertjax.ops.per_device import QKV, ROWS, per_device, per_device_attention
from bertjax.ops.rope import rope_tables, rotate

# A large finite negative score: exp(MASK - m) underflows to 0 without the inf - inf = NaN of -inf.
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
LOG2E = float(np.log2(np.e))  # scores times LOG2E: exp(x) = exp2(x * LOG2E)
LN2 = float(np.log(2.0))
# Shared memory per program, compiled for sm_90 by triton 3.9 from the kernels' Triton IR (window 128, bytes at
# num_stages 2 / 3; tests/test_pallas_gpu_export.py), against the H100's 227 KB (232,448 B) per block:
#   64 x 64 (default), the largest of forward / dq / dk/dv (dk/dv, on transposed tiles since 2026-11-27): bf16
#     d64 50,176 / 67,584, d128 99,328 / 133,120; f32 d64 82,688 / 116,224, d128 148,224 / 214,528: every case
#     fits, at either stage count.
#   128 x 128: bf16 d64 99,840 / 134,144, d128 197,120 / 263,168 (dq; fits at num_stages 2 only);
#     f32 d128 328,192 (dq) already at num_stages 2: does not fit. 128 x 64 and 64 x 128: f32 d128 fit only at 2.
# Hence 64 x 64: safe for both dtypes up to head_dim 128; larger tiles are for bfloat16, with num_stages 2
# (wider heads default to 2 stages; head_dim 64 to 3, which fits at 64 x 64 in either dtype).
# (Measured before the three-loop split and base-2 softmax, which changed these by under 1 KB: forward bf16 d64
# 41,216 -> 41,984, dq 49,408 -> 50,176, dk/dv 41,728 unchanged; tests/test_pallas_gpu_export.py checks the limit.)
DEFAULT_BLOCK_Q = 64
DEFAULT_BLOCK_K = 64
# Software-pipelining depth by padded head_dim. Measured on an H100 (bench.attention_bench --tune, seq 8192, bf16,
# 12 heads of 64, 2026-11-26; docs/benchmarks.md): at 64 x 64 and 4 warps, 3 stages beat 2 in the global forward
# (0.728 vs 0.760 ms), the global backward (2.048 vs 2.160 ms) and the local forward (0.060 vs 0.062 ms); shared
# memory at 3 stages still fits (above). Head dims over 64 were not timed on a GPU: they keep 2.
DEFAULT_NUM_STAGES_UP_TO_64, DEFAULT_NUM_STAGES_WIDER = 3, 2


def key_block_ranges(segment_ids, local_window: int | None, block_q: int, block_k: int):
    """Per query block, the half-open range [lo, hi) of key blocks the kernels visit.

    Args:
      segment_ids: [batch, seq] int, seq a multiple of block_q and block_k; 0 = padding.
      local_window: None (global) or w: query i sees key j only if |i - j| <= w // 2.
    Returns:
      (lo, hi): int32 [batch, seq // block_q]. hi - lo is the number of key blocks loaded for that query block.
    Works on numpy or jax arrays (eagerly or traced); the kernels call it on the padded segment ids.
    """
    segment_ids = jnp.asarray(segment_ids, jnp.int32)
    batch, seq = segment_ids.shape
    if seq % block_q or seq % block_k:
        raise ValueError(f"key_block_ranges: seq ({seq}) must be a multiple of block_q ({block_q}) and "
                         f"block_k ({block_k})")
    num_q, num_k = seq // block_q, seq // block_k

    def segment_span(block):
        ids = segment_ids.reshape(batch, seq // block, block)
        # Padding (0) belongs to no segment: it must not widen the span. A block of only padding gets an empty span.
        lowest = jnp.min(jnp.where(ids == 0, jnp.iinfo(jnp.int32).max, ids), axis=-1)
        return lowest, jnp.max(ids, axis=-1)

    q_min, q_max = segment_span(block_q)
    k_min, k_max = segment_span(block_k)
    visible = (k_min[:, None, :] <= q_max[:, :, None]) & (k_max[:, None, :] >= q_min[:, :, None])
    if local_window is not None:
        half = local_window // 2
        q_first = np.arange(num_q) * block_q
        k_first = np.arange(num_k) * block_k
        near = ((k_first[None, :] <= q_first[:, None] + block_q - 1 + half)
                & (k_first[None, :] + block_k - 1 >= q_first[:, None] - half))
        visible = visible & near[None]
    index = jnp.arange(num_k, dtype=jnp.int32)
    hi = jnp.max(jnp.where(visible, index + 1, 0), axis=-1)
    lo = jnp.minimum(jnp.min(jnp.where(visible, index, num_k), axis=-1), hi)
    return lo.astype(jnp.int32), hi.astype(jnp.int32)


def full_block_ranges(segment_ids, local_window: int | None, block_q: int, block_k: int, lo):
    """Per query block, the range [full_lo, full_hi) of key blocks inside [lo, hi) that are fully visible: both
    blocks lie in one non-padding segment and, for local attention, every pair is inside the window. The kernels
    compute no mask there. When the fully visible blocks are not contiguous (segment ids that come back along the
    row) or there are none, the range is empty at lo, and every block is masked as before.

    Args as `key_block_ranges`, plus its `lo`. Returns int32 [batch, seq // block_q] twice.
    """
    segment_ids = jnp.asarray(segment_ids, jnp.int32)
    batch, seq = segment_ids.shape
    num_q, num_k = seq // block_q, seq // block_k

    def one_segment(block):  # the block's segment id when it has only one and no padding, else -1
        ids = segment_ids.reshape(batch, seq // block, block)
        first = ids[..., 0]
        return jnp.where(jnp.all(ids == first[..., None], axis=-1) & (first != 0), first, -1)

    q_ids, k_ids = one_segment(block_q), one_segment(block_k)
    full = (q_ids[:, :, None] == k_ids[:, None, :]) & (q_ids[:, :, None] >= 0)
    if local_window is not None:
        half = local_window // 2
        q_first = np.arange(num_q)[:, None] * block_q
        k_first = np.arange(num_k)[None, :] * block_k
        full = full & ((q_first + block_q - 1 - k_first <= half) & (k_first + block_k - 1 - q_first <= half))[None]
    index = jnp.arange(num_k, dtype=jnp.int32)
    full_hi = jnp.max(jnp.where(full, index + 1, 0), axis=-1)
    full_lo = jnp.min(jnp.where(full, index, num_k), axis=-1)
    usable = (jnp.sum(full, axis=-1) == full_hi - full_lo) & (full_hi > 0)
    lo = jnp.asarray(lo, jnp.int32)
    return jnp.where(usable, full_lo, lo).astype(jnp.int32), jnp.where(usable, full_hi, lo).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class _Static:
    """Compile-time settings shared by the three kernels (hashable: a custom_vjp non-differentiable argument)."""

    scale: float
    half: int | None  # local_window // 2, or None for global attention
    block_q: int
    block_k: int
    interpret: bool
    num_warps: int
    num_stages: int
    alibi: bool = False  # add -slope_h * |i - j| (slopes: an operand, one per query head, padded to a power of 2)
    # q, k and v are slots 0, 1 and 2 of one stacked array [batch, seq, 3, heads, head_dim] (q and k rotated), and
    # the backward writes the stacked projection's gradient whole, RoPE's backward applied to q's and k's
    # (pallas_gpu_rope_attention).
    stacked: bool = False
    dq: _Static | None = None  # the dq kernel's settings where they differ from these
    dkv: _Static | None = None  # the dk/dv kernel's settings where they differ from the dq kernel's
    forward_kernel: str = "triton"  # a FORWARD_KERNELS name
    backward_kernel: str = "triton"  # a BACKWARD_KERNELS name (dq and dk/dv)

    def backward_kernels(self) -> tuple[_Static, _Static]:
        dq = self.dq or self
        return dq, self.dkv or dq


def _visible(q_seg, k_seg, q_first, k_first, half):
    """[block_q, block_k] mask of one tile: same non-padding segment and, for local attention, inside the window."""
    mask = (q_seg[:, None] == k_seg[None, :]) & (q_seg[:, None] != 0)
    if half is not None:
        q_pos = q_first + lax.broadcasted_iota(jnp.int32, (q_seg.shape[0], k_seg.shape[0]), 0)
        k_pos = k_first + lax.broadcasted_iota(jnp.int32, (q_seg.shape[0], k_seg.shape[0]), 1)
        mask = mask & (jnp.abs(q_pos - k_pos) <= half)
    return mask


def _alibi_slope(slopes_ref, h):
    """Query head h's ALiBi slope in log2 units: the whole (power-of-two) slope vector is loaded and the head's slope
    selected with a where/sum, which lowers to Triton without a scalar load."""
    slopes = slopes_ref[...]
    return jnp.sum(jnp.where(lax.broadcasted_iota(jnp.int32, slopes.shape, 0) == h, slopes, 0.0)) * LOG2E


def _scores(q, k, st: _Static, slope, q_first, k_first):
    """(s, factor): the scores of one tile in log2 units are s * factor. Without ALiBi, s is q.k itself and factor
    scale * LOG2E, so the forward takes its row max before scaling and folds the scaling into the exponent's fused
    multiply-add (one multiply per score fewer); with ALiBi (slope from `_alibi_slope`) s already holds the scaled
    scores plus the bias, and factor is 1."""
    s = _dot(q, k, ((1,), (1,)))
    if slope is None:
        return s, st.scale * LOG2E
    shape = (q.shape[0], k.shape[0])
    distance = jnp.abs((q_first - k_first) + lax.broadcasted_iota(jnp.int32, shape, 0)
                       - lax.broadcasted_iota(jnp.int32, shape, 1))
    return s * (st.scale * LOG2E) - slope * distance.astype(jnp.float32), 1.0


def _times(s, factor: float):
    return s if factor == 1.0 else s * factor


def _dot(a, b, contract=((1,), (0,))):
    # float32 inputs: full precision (no TF32) so results match the reference tightly; bfloat16: tensor cores.
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else None
    return lax.dot_general(a, b, (contract, ((), ())), precision=precision, preferred_element_type=jnp.float32)



def _rope_backward(grad, cos, sin, dtype):
    """The gradient of q (or k) before RoPE from the one after it, float32 [rows, head_dim]; cos and sin [rows,
    head_dim] (each half's table twice). RoPE is q cos + rot(q) sin with rot(q) = [-q2, q1], so the gradient is
    g cos + rot^T(g sin) with rot^T(u) = [u2, -u1]: a swap of halves, which Triton (no lane shuffle) does as a
    product with a signed permutation, once per program at its store. The product runs in the inputs' dtype:
    exact for a permutation, and for bfloat16 on the tensor cores (a float32 one spilled both kernels' registers
    when compiled for sm_90); it rounds g sin to bfloat16 once, as the split path rounds the gradient before
    RoPE's backward."""
    dim, half = grad.shape[1], grad.shape[1] // 2
    row = lax.broadcasted_iota(jnp.int32, (dim, dim), 0)
    col = lax.broadcasted_iota(jnp.int32, (dim, dim), 1)
    swap = jnp.where(col == row + half, -1.0, jnp.where(col == row - half, 1.0, 0.0)).astype(dtype)
    return grad * cos + _dot((grad * sin).astype(dtype), swap)


def _rows_of(ref, slot: int, b, rows, head, st: _Static):
    """Rows of one head of q, k or v (slot 0, 1, 2): from its own array, or its slot of the stacked one."""
    return ref[b, rows, slot, head, :] if st.stacked else ref[b, rows, head, :]


def _head_block(st: _Static, rows: int, head_dim: int, slot: int):
    """BlockSpec of one (batch, rows, head) block of q, k or v, over grid (b, head, row block)."""
    if st.stacked:
        return pl.BlockSpec((None, rows, None, None, head_dim), lambda b, h, i: (b, i, slot, h, 0))
    return pl.BlockSpec((None, rows, None, head_dim), lambda b, h, i: (b, i, h, 0))


def online_softmax_step(acc, m, l, s, v, factor: float = 1.0):
    """One key block of a flash forward loop over scores s * factor in log2 units (factor > 0; masked entries of s
    already -inf, or MASK_VALUE where factor is 1): rescale the running output, max and sum, add this block's p @ v.
    m starts at MASK_VALUE (finite: exp2(m - m_new) never meets inf - inf). Returns (acc, m, l)."""
    m_new = jnp.maximum(m, _times(jnp.max(s, axis=-1), factor))
    # A row with nothing visible so far keeps m_new == MASK_VALUE; exponentiating against 0 there sends its masked
    # entries to exp2(-inf or MASK_VALUE) = 0. So masked entries need no second select per element, only this one
    # per row.
    m_safe = jnp.where(m_new > 0.5 * MASK_VALUE, m_new, 0.0)
    p = jnp.exp2(_times(s, factor) - m_safe[:, None])
    alpha = jnp.exp2(m - m_safe)
    acc = acc * alpha[:, None] + _dot(p.astype(v.dtype), v)
    return acc, m_new, l * alpha + jnp.sum(p, axis=-1)


def finish_softmax(acc, m, l, o_ref, lse_ref):
    """Write a flash forward's output and natural log-sum-exp (m in log2 units). A row with no visible key
    (padding) gets output 0 and a log-sum-exp the backward pass never uses."""
    empty = l == 0.0
    safe_l = jnp.where(empty, 1.0, l)
    o_ref[...] = (acc / safe_l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, 0.0, m * LN2 + jnp.log(safe_l))


def three_loops(lo, full_lo, full_hi, hi, body, carry):
    """fori_loop over [lo, hi) as three loops: masked [lo, full_lo), unmasked [full_lo, full_hi), masked
    [full_hi, hi). body(masked: bool) -> loop body."""
    carry = lax.fori_loop(lo, full_lo, body(True), carry)
    carry = lax.fori_loop(full_lo, full_hi, body(False), carry)
    return lax.fori_loop(full_hi, hi, body(True), carry)


def _forward_kernel(lo_ref, full_lo_ref, full_hi_ref, hi_ref, seg_ref, slopes_ref, q_ref, k_ref, v_ref, o_ref,
                    lse_ref, *, st: _Static, group: int):
    b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    kv_head = lax.div(h, group)
    q_first = i * st.block_q
    q = q_ref[...]  # [block_q, head_dim]
    q_seg = seg_ref[b, pl.ds(q_first, st.block_q)]
    slope = _alibi_slope(slopes_ref, h) if st.alibi else None

    def body(masked):
        def step(j, carry):
            acc, m, l = carry
            keys = pl.ds(j * st.block_k, st.block_k)
            k = _rows_of(k_ref, 1, b, keys, kv_head, st)
            v = _rows_of(v_ref, 2, b, keys, kv_head, st)
            s, factor = _scores(q, k, st, slope, q_first, j * st.block_k)
            if masked:
                # -inf, not MASK_VALUE: s is scaled inside the step, and MASK_VALUE * factor would rise above the
                # running max's MASK_VALUE start (exp2(-inf) is exactly 0, and nothing adds to it).
                s = jnp.where(_visible(q_seg, seg_ref[b, keys], q_first, j * st.block_k, st.half), s, -jnp.inf)
            return online_softmax_step(acc, m, l, s, v, factor)
        return step

    init = (jnp.zeros(q.shape, jnp.float32), jnp.full((st.block_q,), MASK_VALUE, jnp.float32),
            jnp.zeros((st.block_q,), jnp.float32))
    acc, m, l = three_loops(lo_ref[b, i], full_lo_ref[b, i], full_hi_ref[b, i], hi_ref[b, i], body, init)
    finish_softmax(acc, m, l, o_ref, lse_ref)


def _dq_kernel(lo_ref, full_lo_ref, full_hi_ref, hi_ref, seg_ref, slopes_ref, q_ref, do_ref, o_ref, lse_ref,
               dlse_ref, k_ref, v_ref, cos_ref, sin_ref, dq_ref, delta_ref, lse2_ref, *, st: _Static, group: int):
    b, h, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    kv_head = lax.div(h, group)
    q_first = i * st.block_q
    q, do = q_ref[...], do_ref[...]
    # delta_i = sum_d dO_id O_id, the softmax backward's row term, from the dO block this program holds anyway and
    # the output block (read once here, where XLA would read dO and O again in a kernel of its own); the dk/dv
    # kernel reads what this one writes. A log-sum-exp cotangent g enters as ds = p (dP - (delta - g)).
    delta = jnp.sum(do.astype(jnp.float32) * o_ref[...].astype(jnp.float32), axis=1)
    if dlse_ref is not None:
        delta = delta - dlse_ref[...]
    delta_ref[...] = delta
    # The log-sum-exp in log2 units, for the dk/dv kernel too: it reads each query block's once per key block,
    # along its tiles' columns, where a thread holds many entries (16 of 64 at 64 x 64, against 2 of a row).
    lse2 = lse_ref[...] * LOG2E
    lse2_ref[...] = lse2
    q_seg = seg_ref[b, pl.ds(q_first, st.block_q)]
    slope = _alibi_slope(slopes_ref, h) if st.alibi else None

    def body(masked):
        def step(j, dq):
            keys = pl.ds(j * st.block_k, st.block_k)
            k = _rows_of(k_ref, 1, b, keys, kv_head, st)
            v = _rows_of(v_ref, 2, b, keys, kv_head, st)
            p = jnp.exp2(_times(*_scores(q, k, st, slope, q_first, j * st.block_k)) - lse2[:, None])
            if masked:
                p = jnp.where(_visible(q_seg, seg_ref[b, keys], q_first, j * st.block_k, st.half), p, 0.0)
            ds = p * (_dot(do, v, ((1,), (1,))) - delta[:, None])
            return dq + _dot(ds.astype(k.dtype), k)
        return step

    dq = three_loops(lo_ref[b, i], full_lo_ref[b, i], full_hi_ref[b, i], hi_ref[b, i], body,
                     jnp.zeros(q.shape, jnp.float32)) * st.scale
    if st.stacked:  # this block of the stacked gradient's q slot, RoPE's backward applied
        dq = _rope_backward(dq, cos_ref[...], sin_ref[...], q.dtype)
    dq_ref[...] = dq.astype(dq_ref.dtype)


def dkv_tile(k_refs, q_refs, b, h, i, st: _Static, slope, masked: bool, dk, dv, use_ds=None):
    """One streamed query block i of head h in a dk/dv program on transposed tiles: (dk, dv) with its terms added.
    k_refs: (k, v, k's segment ids, k_first) the program holds; q_refs: the q, dO, lse2, delta and segment-id refs.
    use_ds(ds^T), if given, gets ds^T [block_k, block_q] in the inputs' dtype before dk's product (the one-pass
    backward's dq: in that order its kernel needs ~10 registers fewer and does not spill in local layers)."""
    k, v, k_seg, k_first = k_refs
    q_ref, do_ref, lse2_ref, delta_ref, seg_ref = q_refs
    queries = pl.ds(i * st.block_q, st.block_q)
    q = _rows_of(q_ref, 0, b, queries, h, st)
    do = do_ref[b, queries, h, :]
    p = jnp.exp2(_times(*_scores(k, q, st, slope, k_first, i * st.block_q)) - lse2_ref[b, h, queries][None, :])
    if masked:
        p = jnp.where(_visible(k_seg, seg_ref[b, queries], k_first, i * st.block_q, st.half), p, 0.0)
    dv = dv + _dot(p.astype(do.dtype), do)
    ds = (p * (_dot(v, do, ((1,), (1,))) - delta_ref[b, h, queries][None, :])).astype(q.dtype)
    if use_ds is not None:
        use_ds(ds)
    return dk + _dot(ds, q), dv


def store_dkv(dk, dv, out_refs, cos_ref, sin_ref, b, kv_head, k_first, st: _Static) -> None:
    """A dk/dv program's results (dk not yet scaled): into dk and dv, or the k and v slots of the stacked gradient
    (one out_ref), RoPE's backward applied to k's."""
    dk = dk * st.scale
    if st.stacked:
        [dy_ref] = out_refs
        keys = pl.ds(k_first, st.block_k)
        dy_ref[b, keys, 1, kv_head, :] = _rope_backward(dk, cos_ref[...], sin_ref[...], dy_ref.dtype).astype(
            dy_ref.dtype)
        dy_ref[b, keys, 2, kv_head, :] = dv.astype(dy_ref.dtype)
    else:
        dk_ref, dv_ref = out_refs
        dk_ref[...] = dk.astype(dk_ref.dtype)
        dv_ref[...] = dv.astype(dv_ref.dtype)


def _dkv_kernel(lo_ref, full_lo_ref, full_hi_ref, hi_ref, seg_ref, slopes_ref, k_ref, v_ref, q_ref, do_ref, lse2_ref,
                delta_ref, cos_ref, sin_ref, dy_in_ref, *out_refs, st: _Static, group: int):
    """out_refs: dk and dv; or, stacked, the stacked gradient the dq kernel began (dy_in_ref is the same buffer)."""
    del dy_in_ref
    b, kv_head, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    k_first = j * st.block_k
    k_refs = (k_ref[...], v_ref[...], seg_ref[b, pl.ds(k_first, st.block_k)], k_first)
    q_refs = (q_ref, do_ref, lse2_ref, delta_ref, seg_ref)
    ranges = lo_ref[b, j], full_lo_ref[b, j], full_hi_ref[b, j], hi_ref[b, j]

    def head_step(g, carry):
        h = kv_head * group + g
        slope = _alibi_slope(slopes_ref, h) if st.alibi else None

        def body(masked):
            return lambda i, carry: dkv_tile(k_refs, q_refs, b, h, i, st, slope, masked, *carry)

        return three_loops(*ranges, body, carry)

    zeros = jnp.zeros(k_refs[0].shape, jnp.float32)
    store_dkv(*lax.fori_loop(0, group, head_step, (zeros, zeros)), out_refs, cos_ref, sin_ref, b, kv_head, k_first,
              st)


def check_offsets_fit(where: str, interpret: bool, **arrays) -> None:
    """Triton addresses every element as base + a 32-bit offset (seen in the kernels' Triton IR: `tt.addptr` with
    i32 offsets), so an operand of 2**31 elements or more would wrap around. Interpret mode has no such limit."""
    for name, x in arrays.items():
        if not interpret and x.size >= 2 ** 31:
            raise ValueError(f"{where}: {name} {tuple(x.shape)} has {x.size:,} elements per device, more than the "
                             f"kernel's 32-bit offsets address (2**31); split the batch (fewer rows per device)")


def _compiler_params(st: _Static):
    if st.interpret:
        return None
    from jax.experimental.pallas import triton as pl_triton  # GPU-only module; interpret mode does not need it
    return pl_triton.CompilerParams(num_warps=st.num_warps, num_stages=st.num_stages)


def block_ranges(segment_ids, local_window, block_q: int, block_k: int):
    """(lo, full_lo, full_hi, hi) per query block: the key blocks a program visits, and the fully visible ones."""
    lo, hi = key_block_ranges(segment_ids, local_window, block_q, block_k)
    return (lo, *full_block_ranges(segment_ids, local_window, block_q, block_k, lo), hi)


def _whole():
    """Spec of an operand the kernel indexes itself (looped-over blocks, scalars): the whole array."""
    return pl.no_block_spec


def _heads_shape(q, k, st: _Static):
    """(batch, seq, heads, head_dim) of q and the kv heads, from their own arrays or the stacked one."""
    if st.stacked:
        batch, seq, _, heads, head_dim = q.shape
        return (batch, seq, heads, head_dim), heads
    return q.shape, k.shape[2]


def _forward(q, k, v, seg, slopes, st: _Static):
    """(out, lse); q, k and v their own arrays, or (st.stacked) each the stacked one."""
    return load_function(FORWARD_KERNELS[st.forward_kernel])(q, k, v, seg, slopes, st)


def _triton_forward(q, k, v, seg, slopes, st: _Static):
    (batch, seq, heads, head_dim), kv_heads = _heads_shape(q, k, st)
    group = heads // kv_heads
    ranges = block_ranges(seg, None if st.half is None else 2 * st.half, st.block_q, st.block_k)
    q_block = _head_block(st, st.block_q, head_dim, 0)
    out_block = pl.BlockSpec((None, st.block_q, None, head_dim), lambda b, h, i: (b, i, h, 0))
    row_block = pl.BlockSpec((None, None, st.block_q), lambda b, h, i: (b, h, i))
    return pl.pallas_call(
        functools.partial(_forward_kernel, st=st, group=group),
        grid=(batch, heads, seq // st.block_q),
        in_specs=[_whole()] * 6 + [q_block, _whole(), _whole()],
        out_specs=[out_block, row_block],
        out_shape=[jax.ShapeDtypeStruct((batch, seq, heads, head_dim), q.dtype),
                   jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32)],
        compiler_params=_compiler_params(st),
        interpret=st.interpret,
        name="bertjax_flash_forward",
    )(*ranges, seg, slopes, q, k, v)


# The forward kernels ("module:function" taking (q, k, v, seg, slopes, st) -> (out, natural lse [batch, heads, seq])):
# the backward reads their residuals alike. The Mosaic GPU one is imported only when asked for.
FORWARD_KERNELS = {
    "triton": "bertjax.ops.pallas_gpu_attention:_triton_forward",
    "mosaic": "bertjax.ops.mosaic_gpu_attention:forward",
}


# The backward kernels ("module:function" taking _backward's arguments), each reading any forward's residuals.
# "triton_atomic" is one kernel adding dq across programs with float atomics: fewer products per tile, dq's rounding
# not reproducible run to run (pallas_gpu_attention_one_pass.py).
BACKWARD_KERNELS = {
    "triton": "bertjax.ops.pallas_gpu_attention:_triton_backward",
    "triton_atomic": "bertjax.ops.pallas_gpu_attention_one_pass:backward",
    "mosaic": "bertjax.ops.mosaic_gpu_attention_backward:backward",
}


# The backward kernels with a stacked q/k/v path.
STACKED_BACKWARD_KERNELS = ("triton", "triton_atomic")


def _backward(q, k, v, seg, slopes, out, lse, do, st: _Static, dlse=None, cos=None, sin=None):
    return load_function(BACKWARD_KERNELS[st.backward_kernel])(q, k, v, seg, slopes, out, lse, do, st, dlse=dlse,
                                                                cos=cos, sin=sin)


def _triton_backward(q, k, v, seg, slopes, out, lse, do, st: _Static, dlse=None, cos=None, sin=None):
    """(dq, dk, dv); with st.stacked (q, k and v each the stacked array, cos and sin [batch, seq, head_dim] RoPE
    tables, each half's twice) the stacked projection's gradient instead, RoPE's backward applied to its q and k
    slots."""
    # Each backward kernel has its own tiles: the block ranges below are recomputed for them.
    st, dkv_st = st.backward_kernels()
    (batch, seq, heads, head_dim), kv_heads = _heads_shape(q, k, st)
    group = heads // kv_heads
    window = None if st.half is None else 2 * st.half

    ranges = block_ranges(seg, window, st.block_q, st.block_k)
    q_block = pl.BlockSpec((None, st.block_q, None, head_dim), lambda b, h, i: (b, i, h, 0))  # do, out
    row_block = pl.BlockSpec((None, None, st.block_q), lambda b, h, i: (b, h, i))
    table = lambda block: None if cos is None else pl.BlockSpec((None, block, head_dim), lambda b, h, i: (b, i, 0))
    if st.stacked:  # the dq kernel writes the q slot of the stacked gradient; the dk/dv kernel the other two
        dq_block = _head_block(st, st.block_q, head_dim, 0)
        dq_shape = jax.ShapeDtypeStruct(v.shape, v.dtype)
    else:
        dq_block, dq_shape = q_block, jax.ShapeDtypeStruct(q.shape, q.dtype)
    # The dq kernel also writes delta (the softmax backward's row term) and the log-sum-exp in log2 units for the
    # dk/dv kernel.
    dq, delta, lse2 = pl.pallas_call(
        functools.partial(_dq_kernel, st=st, group=group),
        grid=(batch, heads, seq // st.block_q),
        in_specs=[_whole()] * 6 + [_head_block(st, st.block_q, head_dim, 0), q_block, q_block, row_block,
                                   None if dlse is None else row_block, _whole(), _whole(), table(st.block_q),
                                   table(st.block_q)],
        out_specs=[dq_block, row_block, row_block],
        out_shape=[dq_shape, *[jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32)] * 2],
        compiler_params=_compiler_params(st),
        interpret=st.interpret,
        name="bertjax_flash_dq",
    )(*ranges, seg, slopes, q, do, out, lse, dlse, k, v, cos, sin)

    # The visibility rule is symmetric, so the query-block ranges of a key block are the same functions transposed.
    st = dkv_st
    k_ranges = block_ranges(seg, window, st.block_k, st.block_q)
    k_block, v_block = _head_block(st, st.block_k, head_dim, 1), _head_block(st, st.block_k, head_dim, 2)
    k_table = None if cos is None else pl.BlockSpec((None, st.block_k, head_dim), lambda b, g, j: (b, j, 0))
    operands = (*k_ranges, seg, slopes, k, v, q, do, lse2, delta, cos, sin)
    if st.stacked:
        # The dq kernel's output comes in and goes out as one buffer, this kernel filling its k and v slots.
        extra = dict(out_specs=_whole(), out_shape=dq_shape, input_output_aliases={len(operands): 0})
        operands = (*operands, dq)
    else:
        extra = dict(out_specs=[k_block, v_block],
                     out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)])
        operands = (*operands, None)
    grads = pl.pallas_call(
        functools.partial(_dkv_kernel, st=st, group=group),
        grid=(batch, kv_heads, seq // st.block_k),
        in_specs=[_whole()] * 6 + [k_block, v_block, _whole(), _whole(), _whole(), _whole(), k_table, k_table,
                                   _whole() if st.stacked else None],
        compiler_params=_compiler_params(st),
        interpret=st.interpret,
        name="bertjax_flash_dkv",
        **extra,
    )(*operands)
    return grads if st.stacked else (dq, *grads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash_attention(q, k, v, seg, slopes, st: _Static):
    return _forward(q, k, v, seg, slopes, st)[0]


def _flash_attention_fwd(q, k, v, seg, slopes, st: _Static):
    out, lse = _forward(q, k, v, seg, slopes, st)
    return out, (q, k, v, seg, slopes, out, lse)


def _flash_attention_bwd(st: _Static, residuals, do):
    q, k, v, seg, slopes, out, lse = residuals
    dq, dk, dv = _backward(q, k, v, seg, slopes, out, lse, do, st)
    # Segment ids are integers (no cotangent); ALiBi slopes are constants of the model, not trained.
    return dq, dk, dv, None, jnp.zeros_like(slopes)


_flash_attention.defvjp(_flash_attention_fwd, _flash_attention_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _flash_rope_attention(y, cos, sin, seg, slopes, st: _Static):
    return _flash_rope_attention_fwd(y, cos, sin, seg, slopes, st)[0]


def _flash_rope_attention_fwd(y, cos, sin, seg, slopes, st: _Static):
    # One XLA fusion rotates q and k into a stack with v: the kernels read all three from it, and it is all the
    # backward keeps of them (as much as the split path keeps: rotated q and k, and v).
    rotated = jnp.stack([rotate(y[:, :, 0], cos, sin), rotate(y[:, :, 1], cos, sin), y[:, :, 2]], axis=2)
    out, lse = _forward(rotated, rotated, rotated, seg, slopes, st)
    return out, (rotated, cos, sin, seg, slopes, out, lse)


def _flash_rope_attention_bwd(st: _Static, residuals, do):
    rotated, cos, sin, seg, slopes, out, lse = residuals
    both_halves = lambda table: jnp.concatenate([table, table], axis=-1)
    dy = _backward(rotated, rotated, rotated, seg, slopes, out, lse, do, st, cos=both_halves(cos),
                   sin=both_halves(sin))
    # The tables are functions of integer positions: nothing to train.
    return dy, None, None, None, jnp.zeros_like(slopes)


_flash_rope_attention.defvjp(_flash_rope_attention_fwd, _flash_rope_attention_bwd)


# (out, lse [batch, heads, seq]): the local part of an attention whose softmax continues over global keys.
_flash_attention_lse = attention_with_lse(_forward, _backward)


def _with_global_tokens(q, k, v, seg, slopes, glob, global_slots, st: _Static, heads: int):
    """Local attention in the kernel (which visits only the window's key blocks) merged through its log-sum-exp with
    the global keys beyond the window, and the global queries' own rows (global_tokens.py, shared with Pallas TPU)."""
    return merge_global_tokens(q, k, v, seg, glob, global_slots, scale=st.scale, half=st.half,
                               slopes=slopes[:heads] if st.alibi else None,
                               local=lambda q, k, v: _flash_attention_lse(q, k, v, seg, slopes, st))


def pallas_gpu_attention(q, k, v, *, segment_ids, local_window, scale, interpret=False, alibi_slopes=None,
                         global_tokens=None, global_slots=None, forward_kernel: str = "triton",
                         backward_kernel: str = "triton", **tiles):
    """Flash attention on GPU (or on CPU with interpret=True). Shapes and meaning as `bertjax.ops.attention`.

    tiles (`TILE_ARGUMENTS`, each None or left out for its default) set each kernel's tiles and launch:
    block_q, block_k (default 64 x 64), num_warps (4 up to head_dim 64, else 8) and num_stages (3 up to head_dim 64,
    else 2) the forward's; backward_block_q, ... the dq kernel's and, unless dkv_block_q, ... say otherwise, the
    dk/dv kernel's, each defaulting to the forward's value. block_q always counts query rows and block_k key rows:
    a dq program holds block_q queries and steps through keys block_k at a time, a dk/dv program holds block_k keys
    and steps through queries.

    forward_kernel (a FORWARD_KERNELS name) and backward_kernel (BACKWARD_KERNELS): "triton", or "mosaic" for the
    Pallas Mosaic GPU kernels (mosaic_gpu_attention.py, mosaic_gpu_attention_backward.py: bfloat16 or float16, 64
    held rows per program or 128 for the forward's two-warpgroup layout, no ALiBi); every backward reads every
    forward's residuals. backward_kernel "triton_atomic" is one Triton kernel on the dk/dv kernel's tiles (dkv_*)
    that also adds dq across programs with float atomics (pallas_gpu_attention_one_pass.py): 5 tile products where
    the two kernels take 7, and dq's rounding differs from run to run.

    Under a mesh (`jax.set_mesh`) the kernels run per device in a shard_map (per_device.py): XLA would otherwise
    replicate the Triton call, gathering q, k and v onto every GPU."""
    for name, value, known in (("forward_kernel", forward_kernel, FORWARD_KERNELS),
                               ("backward_kernel", backward_kernel, BACKWARD_KERNELS)):
        if value not in known:
            raise ValueError(f"pallas_gpu_attention: {name} must be one of {sorted(known)}, got {value!r}")
    launch = {name: tiles.get(name) for name in TILE_ARGUMENTS if "num_" in name}  # as asked, before defaults
    tiles = _resolve_tiles("pallas_gpu_attention", tiles)

    def kernel(q, k, v, segment_ids, alibi_slopes, global_tokens):  # one device's shard of batch (and heads)
        return _attention(q, k, v, segment_ids, alibi_slopes, global_tokens, local_window=local_window, scale=scale,
                          interpret=interpret, global_slots=global_slots, tiles=tiles,
                          kernels=(forward_kernel, backward_kernel), launch=launch)

    return per_device_attention(kernel, q, k, v, segment_ids, alibi_slopes, global_tokens)


# The tile and launch settings of the three kernels: the forward's, the dq kernel's (backward_*) and the dk/dv
# kernel's (dkv_*).
_SETTINGS = ("block_q", "block_k", "num_warps", "num_stages")
TILE_ARGUMENTS = tuple(prefix + name for prefix in ("", "backward_", "dkv_") for name in _SETTINGS)


def _resolve_tiles(where: str, tiles: dict) -> dict:
    """Every TILE_ARGUMENTS entry, each unset backward_* taking the forward's value and each unset dkv_* the
    backward_* one; block sizes checked. num_warps / num_stages may stay None: `_statics` picks them by head_dim."""
    unknown = sorted(set(tiles) - set(TILE_ARGUMENTS))
    if unknown:
        raise TypeError(f"{where}: unknown tile argument(s) {unknown}; expected some of {list(TILE_ARGUMENTS)}")
    defaults = dict(block_q=DEFAULT_BLOCK_Q, block_k=DEFAULT_BLOCK_K)
    resolved = {name: defaults.get(name) if tiles.get(name) is None else tiles[name] for name in _SETTINGS}
    for prefix, inherit in (("backward_", ""), ("dkv_", "backward_")):
        for name in _SETTINGS:
            value = tiles.get(prefix + name)
            resolved[prefix + name] = resolved[inherit + name] if value is None else value
    _check_tiles(where, **{name: resolved[name] for name in TILE_ARGUMENTS if name.endswith(("block_q", "block_k"))})
    return resolved


def _check_tiles(where: str, **sizes) -> None:
    # Triton's tensors are powers of two and its dots at least 16 on a side (interpret mode enforces neither).
    for name, size in sizes.items():
        if size < 16 or size & (size - 1):
            raise ValueError(f"{where}: {name} must be a power of two >= 16, got {size}")


def default_launch(padded_head_dim: int) -> tuple[int, int]:
    """(num_warps, num_stages) by padded head_dim (DEFAULT_NUM_STAGES_*: measured on an H100 up to 64)."""
    if padded_head_dim <= 64:
        return 4, DEFAULT_NUM_STAGES_UP_TO_64
    return 8, DEFAULT_NUM_STAGES_WIDER


def _statics(tiles: dict, padded_head_dim: int, **fixed) -> _Static:
    """The forward's _Static from resolved tiles, carrying the dq and dk/dv kernels' where they differ. fixed: the
    fields every kernel shares (scale, half, interpret, alibi, stacked)."""
    default_warps, default_stages = default_launch(padded_head_dim)

    def kernel(prefix: str) -> _Static:
        return _Static(block_q=tiles[prefix + "block_q"], block_k=tiles[prefix + "block_k"],
                       num_warps=tiles[prefix + "num_warps"] or default_warps,
                       num_stages=tiles[prefix + "num_stages"] or default_stages, **fixed)

    forward, dq, dkv = kernel(""), kernel("backward_"), kernel("dkv_")
    return dataclasses.replace(forward, dq=None if dq == forward else dq, dkv=None if dkv == dq else dkv)


def _padded_seq(seq: int, tiles: dict) -> int:
    # Every tile size is a power of two, so the largest is a multiple of all of them: every kernel's blocks divide
    # the padded sequence.
    widest = max(tiles[name] for name in TILE_ARGUMENTS if name.endswith(("block_q", "block_k")))
    return -(-seq // widest) * widest


def _attention(q, k, v, segment_ids, alibi_slopes, global_tokens, *, local_window, scale, interpret, global_slots,
               tiles, kernels=("triton", "triton"), launch=None):
    batch, seq, heads, head_dim = q.shape
    padded_seq = _padded_seq(seq, tiles)
    forward_kernel, backward_kernel = kernels
    mosaic = [name for name, kernel in (("forward", forward_kernel), ("dq", backward_kernel), ("dkv", backward_kernel))
              if kernel == "mosaic"]
    # wgmma reads 128-byte swizzled rows: the Mosaic kernels pad head_dim to at least 64 (of 16-bit elements).
    padded_dim = max(64 if mosaic else 16, pl.next_power_of_2(head_dim))
    if mosaic:
        from bertjax.ops.mosaic_gpu_attention import check_kernels
        check_kernels("pallas_gpu_attention", mosaic, dtype=q.dtype, padded_head_dim=padded_dim,
                      alibi=alibi_slopes is not None, tiles=tiles, asked=launch or {})

    def pad(x, seq_axis_pad, dim_pad):
        widths = [(0, 0), (0, seq_axis_pad)] + [(0, 0)] * (x.ndim - 2)
        if x.ndim == 4:
            widths[3] = (0, dim_pad)
        return jnp.pad(x, widths) if seq_axis_pad or dim_pad else x

    tail, extra_dim = padded_seq - seq, padded_dim - head_dim
    st = _statics(tiles, padded_dim, scale=float(scale), half=None if local_window is None else local_window // 2,
                  interpret=bool(interpret), alibi=alibi_slopes is not None, forward_kernel=forward_kernel,
                  backward_kernel=backward_kernel)
    # One slope per query head, padded to a power of two (>= 16) so the kernels load it as one vector.
    slopes = jnp.zeros((max(16, pl.next_power_of_2(heads)),), jnp.float32)
    if alibi_slopes is not None:
        slopes = slopes.at[:heads].set(jnp.asarray(alibi_slopes, jnp.float32))
    q, k, v = pad(q, tail, extra_dim), pad(k, tail, extra_dim), pad(v, tail, extra_dim)
    check_offsets_fit("pallas_gpu_attention", interpret, q=q, k=k)
    seg = pad(segment_ids.astype(jnp.int32), tail, 0)
    if global_tokens is not None and st.half is not None:
        out = _with_global_tokens(q, k, v, seg, slopes, pad(global_tokens, tail, 0), global_slots, st, heads)
    else:  # a global layer already sees every global token
        out = _flash_attention(q, k, v, seg, slopes, st)
    return out[:, :seq, :, :head_dim]


def pallas_gpu_rope_attention(qkv, positions, theta: float, *, segment_ids, local_window, scale, interpret=False,
                              backward_kernel: str = "triton", **tiles):
    """attention(rope(q), rope(k), v) of a stacked projection qkv [batch, seq, 3, heads, head_dim] (q, k, v in that
    order; head_dim a power of two >= 16; no ALiBi, GQA or global tokens), differentiated to qkv as a whole.

    The same kernels as `pallas_gpu_attention`, with the stacked projection's memory traffic cut: one XLA fusion
    rotates q and k into a stack with v, which the kernels read (no separate copies of q, k and v), and the
    backward's dq and dk/dv kernels write qkv's gradient themselves, RoPE's backward applied as they store (one
    product with a signed permutation per program): XLA otherwise rotates dq and dk back and concatenates them with
    dv into that gradient, reading and writing it all once more (310 MB a layer of modernbert-base's step at
    32 x 1024, 3.5 ms of it on an H100: docs/benchmarks.md). Under a mesh the kernels run per device as
    `pallas_gpu_attention`'s do, and tiles set them as there; backward_kernel "triton" or "triton_atomic" as
    there (the Mosaic GPU kernels have no stacked path).
    """
    batch, seq, three, heads, head_dim = qkv.shape
    if three != 3 or head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"pallas_gpu_rope_attention: qkv must be [batch, seq, 3, heads, head_dim] with head_dim a "
                         f"power of two >= 16, got {qkv.shape}")
    if backward_kernel not in STACKED_BACKWARD_KERNELS:
        raise ValueError(f"pallas_gpu_rope_attention: backward_kernel must be one of {list(STACKED_BACKWARD_KERNELS)}, "
                         f"got {backward_kernel!r}")
    tiles = _resolve_tiles("pallas_gpu_rope_attention", tiles)

    def kernel(qkv, positions, segment_ids):  # one device's shard of batch (and heads)
        batch, seq = segment_ids.shape
        tail = _padded_seq(seq, tiles) - seq
        pad = lambda x: jnp.pad(x, [(0, 0), (0, tail)] + [(0, 0)] * (x.ndim - 2)) if tail else x
        cos, sin = rope_tables(positions, head_dim, theta)
        st = _statics(tiles, head_dim, scale=float(scale), half=None if local_window is None else local_window // 2,
                      interpret=bool(interpret), stacked=True, backward_kernel=backward_kernel)
        qkv = pad(qkv)
        check_offsets_fit("pallas_gpu_rope_attention", interpret, qkv=qkv)
        slopes = jnp.zeros((max(16, pl.next_power_of_2(qkv.shape[3])),), jnp.float32)
        out = _flash_rope_attention(qkv, pad(cos), pad(sin), pad(segment_ids.astype(jnp.int32)), slopes, st)
        return out[:, :seq]

    stacked = ("batch", None, None, "heads", None)
    return per_device(kernel, (qkv, positions, segment_ids), (stacked, ROWS, ROWS), QKV, batch=batch, heads=heads)
