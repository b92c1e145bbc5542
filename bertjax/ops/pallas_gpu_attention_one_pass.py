"""The flash backward of `pallas_gpu_attention` in one Triton kernel: dq, dk and dv from the same tiles, dq added
across programs with float atomics (`backward_kernel="triton_atomic"`, the registry's "pallas_gpu_atomic").

bertjax's default backward (pallas_gpu_attention.py) runs two kernels, each recomputing the scores: dq (3 tile
products: s, dP, dq) and dk/dv (4: s, dv, dP, dk), 7 per tile. This kernel is the dk/dv one with dq added to it:
5 products and one exponential per tile, where FlashAttention-2's backward and cuDNN's stand. On the second H100
lease (docs/benchmarks.md) both backward designs ran their products at about the same rate (405 and 440 TFLOP/s at
seq 16384), so the two products fewer are most of the difference between bertjax's backward (7.13 ms) and cuDNN's
(4.68 ms) there.

The price is that a query block's dq is summed over the programs of every key block that sees it, which run
concurrently: each adds its [block_q, head_dim] part into one float32 buffer with atomic adds, in an order that
changes from run to run, and so does dq's rounding (float32 sums of bf16 products: differences of a few float32
ulps, then rounded to the inputs' dtype). dv is the two-kernel backward's, bit for bit; dk comes from the same
products, with delta summed by XLA instead of the dq kernel (the same float32 row sum, perhaps in another order).
Hence opt-in: the default stays deterministic.

- grid (batch, kv_heads, key blocks), as the dk/dv kernel: holds block_k keys and their values, streams the query
  and dO blocks of every query head sharing them (GQA without repeating k or v), on transposed tiles
  ([keys, queries]: s^T = k q^T). Per tile: p^T, dv += p^T dO, dP^T = v dO^T, ds^T = p^T (dP^T - delta),
  dk += ds^T q, and dq[queries] += (ds^T)^T k, atomically.
- It takes the dk/dv kernel's tiles (`dkv_block_q`, `dkv_block_k`, `dkv_num_warps`, `dkv_num_stages`).
- delta (sum_d dO O per query row, less a log-sum-exp cotangent) and the log-sum-exp in log2 units come from one
  XLA fusion before it (the two-kernel backward's dq kernel computes them; here no kernel holds a query block's dO
  and O together).
- Contention: programs start together, and in a global layer every one would begin its loop at query block 0,
  adding into the same addresses at once. Each program instead starts its loop over the fully visible blocks at
  its own key block's index (mod the range) and wraps around, so programs resident together add to different
  query blocks.
- Stacked q/k/v (`pallas_gpu_rope_attention`): the kernel writes the k and v slots of the stacked gradient (RoPE's
  backward applied to k's, as the two-kernel backward does); dq is complete only after every program, so RoPE's
  backward and the store into the q slot are one XLA fusion after it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from bertjax.ops.pallas_gpu_attention import (LOG2E, _alibi_slope, _compiler_params, _dot, _head_block, _heads_shape,
                                              _Static, _whole, block_ranges, dkv_tile, pallas_gpu_attention,
                                              pallas_gpu_rope_attention, store_dkv)
from bertjax.ops.rope import rotate
from bertjax.ops.triton_atomics import relaxed_atomic_add


def _kernel(lo_ref, full_lo_ref, full_hi_ref, hi_ref, seg_ref, slopes_ref, k_ref, v_ref, q_ref, do_ref, lse2_ref,
            delta_ref, cos_ref, sin_ref, dq_in_ref, dq_ref, *out_refs, st: _Static, group: int):
    """The dk/dv kernel's program (`dkv_tile`, `store_dkv`) adding each tile's dq into dq_ref. out_refs: dk and dv;
    or, stacked, the stacked gradient (its k and v slots written here). dq_ref (float32, the same buffer as
    dq_in_ref, zeros on entry) collects dq / scale."""
    del dq_in_ref
    b, kv_head, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    k_first = j * st.block_k
    k_refs = (k_ref[...], v_ref[...], seg_ref[b, pl.ds(k_first, st.block_k)], k_first)
    q_refs = (q_ref, do_ref, lse2_ref, delta_ref, seg_ref)
    lo, full_lo, full_hi, hi = lo_ref[b, j], full_lo_ref[b, j], full_hi_ref[b, j], hi_ref[b, j]

    def head_step(g, carry):
        h = kv_head * group + g
        slope = _alibi_slope(slopes_ref, h) if st.alibi else None

        def step(i, carry, masked):
            def add_dq(ds):  # dq[queries] += (ds^T)^T k
                relaxed_atomic_add(dq_ref, (b, pl.ds(i * st.block_q, st.block_q), h, slice(None)),
                                   _dot(ds, k_refs[0], ((0,), (0,))))

            return dkv_tile(k_refs, q_refs, b, h, i, st, slope, masked, *carry, use_ds=add_dq)

        masked_step = lambda i, carry: step(i, carry, True)
        carry = lax.fori_loop(lo, full_lo, masked_step, carry)
        count = full_hi - full_lo

        def staggered(t, carry):  # this key block's own place in the range first, then on around it
            return step(full_lo + lax.rem(t + j, count), carry, False)

        carry = lax.fori_loop(0, count, staggered, carry)
        return lax.fori_loop(full_hi, hi, masked_step, carry)

    zeros = jnp.zeros(k_refs[0].shape, jnp.float32)
    store_dkv(*lax.fori_loop(0, group, head_step, (zeros, zeros)), out_refs, cos_ref, sin_ref, b, kv_head, k_first,
              st)


def backward(q, k, v, seg, slopes, out, lse, do, st: _Static, dlse=None, cos=None, sin=None):
    """(dq, dk, dv), or (st.stacked) the stacked projection's gradient: BACKWARD_KERNELS["triton_atomic"], with
    `_triton_backward`'s arguments and results."""
    _, st = st.backward_kernels()  # the dk/dv kernel's tiles
    (batch, seq, heads, head_dim), kv_heads = _heads_shape(q, k, st)
    group = heads // kv_heads
    window = None if st.half is None else 2 * st.half
    # The softmax backward's row term and the log-sum-exp in log2 units, [batch, heads, seq] float32 each.
    delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1).transpose(0, 2, 1)
    if dlse is not None:
        delta = delta - dlse
    lse2 = lse * LOG2E

    k_ranges = block_ranges(seg, window, st.block_k, st.block_q)
    k_block, v_block = _head_block(st, st.block_k, head_dim, 1), _head_block(st, st.block_k, head_dim, 2)
    k_table = None if cos is None else pl.BlockSpec((None, st.block_k, head_dim), lambda b, g, j: (b, j, 0))
    dq_sum = jax.ShapeDtypeStruct((batch, seq, heads, head_dim), jnp.float32)
    operands = (*k_ranges, seg, slopes, k, v, q, do, lse2, delta, cos, sin, jnp.zeros(dq_sum.shape, dq_sum.dtype))
    if st.stacked:  # the k and v slots here; the q slot once dq is complete
        grad_specs, grad_shapes = [_whole()], [jax.ShapeDtypeStruct(v.shape, v.dtype)]
    else:
        grad_specs = [k_block, v_block]
        grad_shapes = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    dq_sum, *grads = pl.pallas_call(
        functools.partial(_kernel, st=st, group=group),
        grid=(batch, kv_heads, seq // st.block_k),
        in_specs=[_whole()] * 6 + [k_block, v_block] + [_whole()] * 4 + [k_table, k_table, _whole()],
        out_specs=[_whole(), *grad_specs],
        out_shape=[dq_sum, *grad_shapes],
        # the dq buffer, the last operand, counted as pallas_call counts them: without the absent (None) ones
        input_output_aliases={len(jax.tree.leaves(operands)) - 1: 0},
        compiler_params=_compiler_params(st),
        interpret=st.interpret,
        name="bertjax_flash_backward_one_pass",
    )(*operands)
    dq = dq_sum * st.scale
    if not st.stacked:
        return (dq.astype(q.dtype), *grads)
    [dy] = grads
    # Written into the kernel's output in place (an `.at[].set` here lowers to a scatter that copies it whole).
    # RoPE's backward is the inverse rotation (its angles negated); the tables here hold each half's twice.
    half = head_dim // 2
    dq_slot = rotate(dq, cos[..., :half], -sin[..., :half]).astype(dy.dtype)[:, :, None]
    return lax.dynamic_update_slice(dy, dq_slot, (0,) * dy.ndim)


def pallas_gpu_atomic_attention(q, k, v, **arguments):
    """The registry's "pallas_gpu_atomic": `pallas_gpu_attention` with this backward."""
    return pallas_gpu_attention(q, k, v, backward_kernel="triton_atomic", **arguments)


def pallas_gpu_atomic_rope_attention(qkv, positions, theta: float, **arguments):
    """"pallas_gpu_atomic"'s stacked q/k/v path: `pallas_gpu_rope_attention` with this backward."""
    return pallas_gpu_rope_attention(qkv, positions, theta, backward_kernel="triton_atomic", **arguments)
