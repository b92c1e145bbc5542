"""The flash backward of `pallas_gpu_attention` in Pallas Mosaic GPU (Hopper: TMA copies and wgmma), for sm_90:
the Triton dq and dk/dv kernels' algorithm (pallas_gpu_attention.py) on one warpgroup per program, with the tile
movement of the Mosaic GPU forward (mosaic_gpu_attention.py): the held tile copied in once, the streamed tiles
through a ring of `num_stages` shared-memory slots, each refilled once the products reading it have returned.

- dq: grid (heads, query blocks, batch); holds 64 queries, their dO and O, streams key and value blocks:
  s = q k^T, p = exp2(s * scale * log2 e - lse2), dp = dO v^T, ds = p (dp - delta), dq += ds k.
- dk/dv: grid (kv_heads, key blocks, batch); holds 64 keys and their values, streams the query and dO blocks of
  every query head sharing them (GQA without repeating k or v) on transposed tiles, so that every product's rows
  are the keys it holds: s^T = k q^T, p^T, dv += p^T dO, dp^T = v dO^T, ds^T = p^T (dp^T - delta), dk += ds^T q.

As in the Triton kernels, the dq kernel also computes delta (the softmax backward's row term, sum_d dO O, less a
log-sum-exp cotangent) and lse2 (the log-sum-exp in log2 units) and writes them for the dk/dv kernel: from a
separate XLA fusion they cost the modernbert-base train step 2.3 GB more of memory traffic (bench.step_floor,
deviceless). Block ranges and masks are the forward's.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from bertjax.ops.mosaic_gpu_attention import (BLOCK_Q, interpret_params, key_value_ring, product, tile_layouts,
                                              tile_transforms, tile_visible)
from bertjax.ops.pallas_gpu_attention import LOG2E, block_ranges, three_loops

HELD = BLOCK_Q  # rows a program holds in either kernel: wgmma's M for one warpgroup


def _dq_kernel(*refs, scale: float, half: int | None, block: int, num_stages: int, group: int, has_dlse: bool,
               staged: bool):
    """refs: block ranges (4), segment ids, lse, [dlse,] q, dO, O, k, v; outputs dq, delta, lse2; scratch."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    refs = list(refs)
    lo_ref, full_lo_ref, full_hi_ref, hi_ref, seg_ref, lse_ref = refs[:6]
    dlse_ref = refs.pop(6) if has_dlse else None
    (q_ref, do_ref, o_ref, k_ref, v_ref, dq_ref, delta_ref, lse2_ref, q_smem, do_smem, k_smem, v_smem, dq_smem,
     delta_smem, lse2_smem, held_barriers, k_barriers, v_barriers) = refs[6:24]
    ds_smem = refs[24] if staged else None
    h, i, b = lax.axis_index("heads"), lax.axis_index("blocks"), lax.axis_index("batch")
    kv_head = lax.div(h, jnp.int32(group))
    first = i * HELD
    held = pl.ds(first, HELD)
    lo, full_lo, full_hi, hi = lo_ref[b, i], full_lo_ref[b, i], full_hi_ref[b, i], hi_ref[b, i]
    rows, columns = tile_layouts()

    plgpu.copy_gmem_to_smem(q_ref.at[b, held, h], q_smem, held_barriers.at[0])
    plgpu.copy_gmem_to_smem(do_ref.at[b, held, h], do_smem, held_barriers.at[1])
    # O passes through the tile dq is written from at the end: it is only needed for delta, before the loop.
    plgpu.copy_gmem_to_smem(o_ref.at[b, held, h], dq_smem, held_barriers.at[2])

    fetch = key_value_ring(k_ref, v_ref, k_smem, v_smem, k_barriers, v_barriers, b=b, kv_head=kv_head, block=block,
                           lo=lo, hi=hi, num_stages=num_stages)
    q_seg = plgpu.load(seg_ref.at[b, held], layout=rows, optimized=False)
    # The log-sum-exp in log2 units and delta_i = sum_d dO_id O_id (less a log-sum-exp cotangent), the softmax
    # backward's row term, as the Triton dq kernel computes them: from the dO tile this program holds anyway and the
    # O tile, read once here where XLA would read dO and O again in a kernel of its own; the dk/dv kernel reads
    # both along its tiles' columns.
    lse2 = plgpu.load(lse_ref.at[b, h, held], layout=rows, optimized=False) * LOG2E
    for barrier in range(3):
        plgpu.barrier_wait(held_barriers.at[barrier])
    wgmma = plgpu.Layout.WGMMA
    delta = (plgpu.load(do_smem, layout=wgmma).astype(jnp.float32)
             * plgpu.load(dq_smem, layout=wgmma).astype(jnp.float32)).sum(axis=1)
    if dlse_ref is not None:
        delta = delta - plgpu.load(dlse_ref.at[b, h, held], layout=rows, optimized=False)
    delta_smem[...] = delta
    lse2_smem[...] = lse2
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(delta_smem, delta_ref.at[b, h, held])
    plgpu.copy_smem_to_gmem(lse2_smem, lse2_ref.at[b, h, held])
    shape = (HELD, block)
    factor = scale * LOG2E

    def body(masked: bool):
        def step(j, dq):
            slot = lax.rem(j - lo, jnp.int32(num_stages))
            plgpu.barrier_wait(k_barriers.at[slot])
            s = product(q_smem, k_smem.at[slot].T, shape)
            p = jnp.exp2(s * factor - lax.broadcast_in_dim(lse2, shape, [0]))
            if masked:
                k_seg = plgpu.load(seg_ref.at[b, pl.ds(j * block, block)], layout=columns, optimized=False)
                p = jnp.where(tile_visible(q_seg, k_seg, first, j * block, half, shape), p, 0.0)
            plgpu.barrier_wait(v_barriers.at[slot])
            dp = product(do_smem, v_smem.at[slot].T, shape)
            ds = p * (dp - lax.broadcast_in_dim(delta, shape, [0]))
            dq = dq + product(ds.astype(k_smem.dtype), k_smem.at[slot], dq.shape, ds_smem)
            pl.when(j + num_stages < hi)(functools.partial(fetch, j + num_stages, slot))
            return dq
        return step

    zeros = plgpu.layout_cast(jnp.zeros((HELD, q_smem.shape[1]), jnp.float32), plgpu.Layout.WGMMA)
    dq = three_loops(lo, full_lo, full_hi, hi, body, zeros)
    dq_smem[...] = (dq * scale).astype(dq_smem.dtype)  # O was read from this tile before the loop
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(dq_smem, dq_ref.at[b, held, h])
    plgpu.wait_smem_to_gmem(0)


def _dkv_kernel(lo_ref, full_lo_ref, full_hi_ref, hi_ref, seg_ref, lse2_ref, delta_ref, k_ref, v_ref, q_ref, do_ref,
                dk_ref, dv_ref, k_smem, v_smem, q_smem, do_smem, dk_smem, dv_smem, held_barriers, q_barriers,
                do_barriers, p_smem=None, ds_smem=None, *, scale: float, half: int | None, block: int,
                num_stages: int, group: int):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    kv_head, j, b = lax.axis_index("heads"), lax.axis_index("blocks"), lax.axis_index("batch")
    first = j * HELD
    held = pl.ds(first, HELD)
    lo, full_lo, full_hi, hi = lo_ref[b, j], full_lo_ref[b, j], full_hi_ref[b, j], hi_ref[b, j]
    count = hi - lo  # query blocks per query head; the ring runs over group * count steps
    rows, columns = tile_layouts()

    plgpu.copy_gmem_to_smem(k_ref.at[b, held, kv_head], k_smem, held_barriers.at[0])
    plgpu.copy_gmem_to_smem(v_ref.at[b, held, kv_head], v_smem, held_barriers.at[1])

    def fetch(t, slot):  # step t: query block lo + t % count of query head kv_head * group + t // count
        h = kv_head * group + lax.div(t, count)
        queries = pl.ds((lo + lax.rem(t, count)) * block, block)
        plgpu.copy_gmem_to_smem(q_ref.at[b, queries, h], q_smem.at[slot], q_barriers.at[slot])
        plgpu.copy_gmem_to_smem(do_ref.at[b, queries, h], do_smem.at[slot], do_barriers.at[slot])

    steps = group * count
    for step in range(num_stages):
        pl.when(step < steps)(functools.partial(fetch, jnp.int32(step), step))
    k_seg = plgpu.load(seg_ref.at[b, held], layout=rows, optimized=False)
    plgpu.barrier_wait(held_barriers.at[0])
    plgpu.barrier_wait(held_barriers.at[1])
    shape = (HELD, block)
    factor = scale * LOG2E

    def head_step(g, carry):
        h = kv_head * group + g

        def body(masked: bool):
            def step(i, carry):
                dk, dv = carry
                t = g * count + (i - lo)
                slot = lax.rem(t, jnp.int32(num_stages))
                queries = pl.ds(i * block, block)
                lse2 = plgpu.load(lse2_ref.at[b, h, queries], layout=columns, optimized=False)
                delta = plgpu.load(delta_ref.at[b, h, queries], layout=columns, optimized=False)
                plgpu.barrier_wait(q_barriers.at[slot])
                s = product(k_smem, q_smem.at[slot].T, shape)  # s^T: keys down, queries across
                p = jnp.exp2(s * factor - lax.broadcast_in_dim(lse2, shape, [1]))
                if masked:
                    q_seg = plgpu.load(seg_ref.at[b, queries], layout=columns, optimized=False)
                    p = jnp.where(tile_visible(k_seg, q_seg, first, i * block, half, shape), p, 0.0)
                plgpu.barrier_wait(do_barriers.at[slot])
                dv = dv + product(p.astype(do_smem.dtype), do_smem.at[slot], dv.shape, p_smem)
                dp = product(v_smem, do_smem.at[slot].T, shape)
                ds = p * (dp - lax.broadcast_in_dim(delta, shape, [1]))
                dk = dk + product(ds.astype(q_smem.dtype), q_smem.at[slot], dk.shape, ds_smem)
                pl.when(t + num_stages < steps)(functools.partial(fetch, t + num_stages, slot))
                return dk, dv
            return step

        return three_loops(lo, full_lo, full_hi, hi, body, carry)

    zeros = plgpu.layout_cast(jnp.zeros((HELD, k_smem.shape[1]), jnp.float32), plgpu.Layout.WGMMA)
    dk, dv = lax.fori_loop(0, group, head_step, (zeros, zeros))
    dk_smem[...] = (dk * scale).astype(dk_smem.dtype)
    dv_smem[...] = dv.astype(dv_smem.dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(dk_smem, dk_ref.at[b, held, kv_head])
    plgpu.copy_smem_to_gmem(dv_smem, dv_ref.at[b, held, kv_head])
    plgpu.wait_smem_to_gmem(0)


def _call(kernel, operands, outputs, scratch, *, grid_heads: int, seq: int, batch: int, interpret: bool):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu.kernel(kernel, out_type=outputs, scratch_types=scratch, grid=(grid_heads, seq // HELD, batch),
                        grid_names=("heads", "blocks", "batch"),
                        compiler_params=plgpu.CompilerParams(approx_math=True),
                        interpret=interpret_params() if interpret else None)(*operands)


def mosaic_backward(q, k, v, seg, out, lse, do, dlse=None, *, scale: float, half: int | None, dq_block: int,
                    dq_stages: int, dkv_block: int, dkv_stages: int, interpret: bool):
    """(dq, dk, dv) of attention(q, k, v) given its output, natural log-sum-exp [batch, heads, seq] and the output's
    cotangent do (and the log-sum-exp's, dlse, where a caller uses it). dq_block: key rows a dq program streams at a
    time; dkv_block: query rows a dk/dv program streams. Shapes as `mosaic_forward`."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    window = None if half is None else 2 * half
    transforms = tile_transforms(q.dtype)
    tile = lambda rows, *lead: plgpu.SMEM((*lead, rows, head_dim), q.dtype, transforms=transforms)
    staging = lambda block: plgpu.SMEM((HELD, block), q.dtype, transforms=transforms)
    common = dict(scale=scale, half=half, group=group)
    row = jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32)

    dq, delta, lse2 = _call(
        functools.partial(_dq_kernel, block=dq_block, num_stages=dq_stages, has_dlse=dlse is not None,
                          staged=interpret, **common),
        (*block_ranges(seg, window, HELD, dq_block), seg, lse, *([] if dlse is None else [dlse]), q, do, out, k, v),
        (jax.ShapeDtypeStruct(q.shape, q.dtype), row, row),
        (tile(HELD), tile(HELD), tile(dq_block, dq_stages), tile(dq_block, dq_stages), tile(HELD),
         plgpu.SMEM((HELD,), jnp.float32), plgpu.SMEM((HELD,), jnp.float32), plgpu.Barrier(num_barriers=3),
         plgpu.Barrier(num_barriers=dq_stages), plgpu.Barrier(num_barriers=dq_stages),
         *([staging(dq_block)] if interpret else [])),
        grid_heads=heads, seq=seq, batch=batch, interpret=interpret)
    # The visibility rule is symmetric: a key block's query-block ranges are the same function with the sides
    # swapped.
    dk, dv = _call(functools.partial(_dkv_kernel, block=dkv_block, num_stages=dkv_stages, **common),
                   (*block_ranges(seg, window, HELD, dkv_block), seg, lse2, delta, k, v, q, do),
                   (jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
                   (tile(HELD), tile(HELD), tile(dkv_block, dkv_stages), tile(dkv_block, dkv_stages), tile(HELD),
                    tile(HELD), plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_barriers=dkv_stages),
                    plgpu.Barrier(num_barriers=dkv_stages),
                    *([staging(dkv_block), staging(dkv_block)] if interpret else [])),
                   grid_heads=kv_heads, seq=seq, batch=batch, interpret=interpret)
    return dq, dk, dv


def backward(q, k, v, seg, slopes, out, lse, do, st, dlse=None, cos=None, sin=None):
    """pallas_gpu_attention's BACKWARD_KERNELS entry: the dq kernel streams st's backward_block_k keys at a time and
    the dk/dv kernel its dkv_block_q queries (each holding 64 rows, checked before tracing)."""
    del slopes  # ALiBi is refused before tracing (check_kernels)
    if cos is not None or sin is not None or st.stacked:
        raise ValueError("the Mosaic GPU backward does not write the stacked q/k/v gradient")
    dq_st, dkv_st = st.backward_kernels()
    return mosaic_backward(q, k, v, seg, out, lse, do, dlse, scale=st.scale, half=st.half, dq_block=dq_st.block_k,
                           dq_stages=dq_st.num_stages, dkv_block=dkv_st.block_q, dkv_stages=dkv_st.num_stages,
                           interpret=st.interpret)
