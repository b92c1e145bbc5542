"""The flash forward of `pallas_gpu_attention` in Pallas Mosaic GPU (Hopper: TMA copies and wgmma), for sm_90, and
what the Mosaic GPU backward (mosaic_gpu_attention_backward.py) shares with it: the wgmma product, the tile mask,
the limits and their checks.

JAX 0.11 deprecates the Pallas Triton backend in favour of Mosaic GPU, and Triton's lowering is where bertjax's
kernels fall short of cuDNN (docs/benchmarks.md). This kernel computes what the Triton forward computes, with the
same contract (out, natural log-sum-exp [batch, heads, seq]), so either backward (Triton's or Mosaic GPU's) takes
its residuals as they are; `pallas_gpu_attention(..., forward_kernel="mosaic")` selects it, and the registry's
"pallas_gpu_mosaic" runs it with the Mosaic GPU backward.

What differs from the Triton forward is how the tiles move:
- one warpgroup (128 threads) per program holds 64 query rows: wgmma's M is 64 per warpgroup; with block_q 128,
  two consumer warpgroups hold 64 each and share every key and value tile, which a producer warpgroup copies in
  (`_kernel_two_warpgroups`, FlashAttention-3's layout);
- the program copies its query tile and then its key and value tiles into shared memory with the Tensor Memory
  Accelerator, `num_stages` tiles ahead of the one it multiplies (a ring of slots, one barrier per slot), so the
  copies of later tiles overlap the products and softmax of this one; a slot is refilled once the products that
  read it have returned;
- q k^T and p v are wgmma products; on a GPU p goes in from registers, never through shared memory.

The block ranges, masks and base-2 online softmax are the Triton kernel's (pallas_gpu_attention.py): the loop
visits only [lo, hi), and only the tiles outside [full_lo, full_hi) compute a mask.

JAX's Mosaic GPU interpret mode, which the CPU tests run, cannot run a wgmma whose first operand is in registers,
nor one that accumulates into registers initialised beforehand (`pl.run_state`). So under interpret=True a
register operand goes through a shared-memory tile first (`product`'s staging), and on both paths each loop step
adds its product to the running sum as a fresh accumulator: an add of [64, head_dim] per tile, against the tile's
64 x block_k exponentials.

Limits (each a clear error, `check_supported`): 16-bit inputs (wgmma reads bfloat16 or float16 tiles), head_dim
padded to 64, 128 or 256 (a 128-byte swizzled row holds 64 of them; at 256 the float32 accumulator alone is 128
registers a thread), 64 held rows (128 for the forward's two-warpgroup layout), streamed tiles of 64, 128 or
256 rows, shared memory within an H100's, no ALiBi. The stacked q/k/v path (`pallas_gpu_rope_attention`) keeps
the Triton kernels.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from bertjax.gpu_aot import HOPPER
from bertjax.ops.pallas_gpu_attention import (LN2, LOG2E, MASK_VALUE, block_ranges, default_launch,
                                              pallas_gpu_attention, three_loops)

BLOCK_Q = 64  # wgmma's M for one warpgroup
SWIZZLE_BYTES = 128
SUPPORTED_DTYPES = (jnp.bfloat16, jnp.float16)
H100_SHARED_MEMORY_BYTES = HOPPER["shared_per_block_optin"]  # 232,448 B per block
REDUCTION_SCRATCH_BYTES = 2048  # plgpu.CompilerParams' reduction_scratch_bytes default


# Per kernel: the 64-row tiles a program holds in shared memory (forward: q and the output; dq: q, dO and O, which
# dq replaces at the end; dk/dv: k, v, dk and dv), the float32 rows it writes through shared memory (the forward's
# log-sum-exp; the dq kernel's delta and log-sum-exp in log2 units), whether it reduces along rows (the forward's
# max and sum, the dq kernel's delta: Mosaic GPU then adds its reduction scratch) and its barriers beyond the ring's.
HELD_TILES = {"forward": 2, "dq": 3, "dkv": 4}
SHARED_ROWS = {"forward": 1, "dq": 2, "dkv": 0}
REDUCES = {"forward": True, "dq": True, "dkv": False}
HELD_BARRIERS = {"forward": 1, "dq": 3, "dkv": 2}
# Each kernel's (held rows, streamed rows) among pallas_gpu_attention's resolved tiles: a dq program holds queries
# and streams keys, a dk/dv program holds keys and streams queries.
TILES = {"forward": ("block_q", "block_k"), "dq": ("backward_block_q", "backward_block_k"),
         "dkv": ("dkv_block_k", "dkv_block_q")}
LAUNCH_PREFIX = {"forward": "", "dq": "backward_", "dkv": "dkv_"}


def shared_memory_bytes(kernel: str, dtype, padded_head_dim: int, block: int, num_stages: int,
                        held: int = BLOCK_Q) -> int:
    """Shared memory one program of `kernel` allocates on a GPU besides its barriers, as Mosaic GPU's resource dump
    gives it (jax 0.11.2, every setting bench.mosaic_gpu_static compiles): the held tiles (held rows each: 128 for
    the two-warpgroup forward), num_stages streamed pairs of [block, head_dim] tiles, any float32 rows (aligned to
    1 KB, the swizzle's alignment) and, for a kernel that reduces along rows, Mosaic GPU's 2 KB of reduction
    scratch."""
    tile = jnp.dtype(dtype).itemsize * padded_head_dim
    aligned = lambda size: -(-size // 1024) * 1024
    return (tile * (HELD_TILES[kernel] * held + 2 * num_stages * block)
            + SHARED_ROWS[kernel] * aligned(4 * held) + REDUCES[kernel] * REDUCTION_SCRATCH_BYTES)


def barrier_bytes(kernel: str, num_stages: int, held: int = BLOCK_Q) -> int:
    """8 B per barrier: Mosaic GPU checks the limit against shared_memory_bytes plus these (its error at the forward's
    head_dim 128, block 128, 3 stages: 232,504 B). The two-warpgroup forward has one query barrier per consumer and
    a pair of release barriers per slot besides."""
    consumers = held // BLOCK_Q
    release = 2 * num_stages if consumers > 1 else 0
    return 8 * (HELD_BARRIERS[kernel] * consumers + 2 * num_stages + release)


def check_supported(where: str, kernel: str, *, dtype, padded_head_dim: int, alibi: bool, held: int, block: int,
                    num_warps: int | None = None, num_stages: int | None = None) -> None:
    """Raise ValueError naming what one Mosaic GPU kernel ("forward", "dq" or "dkv") cannot compute. held / block:
    the rows a program holds and streams; num_warps / num_stages None: the defaults."""
    name = {"forward": "forward", "dq": "dq kernel", "dkv": "dk/dv kernel"}[kernel]
    if jnp.dtype(dtype) not in [jnp.dtype(d) for d in SUPPORTED_DTYPES]:
        raise ValueError(f"{where}: the Mosaic GPU {name} multiplies bfloat16 or float16 tiles, got "
                         f"{jnp.dtype(dtype)} (the Triton kernels take float32)")
    if padded_head_dim % 64 or padded_head_dim > 256:
        raise ValueError(f"{where}: the Mosaic GPU {name} needs head_dim padded to a multiple of 64 up to 256, got "
                         f"{padded_head_dim}")
    held_name, block_name = (LAUNCH_PREFIX[kernel] + "block_" + side for side in ("q", "k"))
    if kernel == "dkv":
        held_name, block_name = block_name, held_name
    allowed = (BLOCK_Q, 2 * BLOCK_Q) if kernel == "forward" else (BLOCK_Q,)
    if held not in allowed:
        raise ValueError(f"{where}: a Mosaic GPU {name} program holds {' or '.join(map(str, allowed))} rows (64 per "
                         f"warpgroup: wgmma's M), got {held_name} {held}")
    if block not in (64, 128, 256):  # a multiple of 64 (the swizzled rows) and, as every tile, a power of two
        raise ValueError(f"{where}: the Mosaic GPU {name}'s {block_name} must be 64, 128 or 256, got {block}")
    if num_warps not in (None, 4):
        raise ValueError(f"{where}: the Mosaic GPU {name} runs one warpgroup ({LAUNCH_PREFIX[kernel]}num_warps 4), "
                         f"got {num_warps}")
    if num_stages is not None and num_stages < 1:
        raise ValueError(f"{where}: {LAUNCH_PREFIX[kernel]}num_stages must be at least 1, got {num_stages}")
    if alibi:
        raise ValueError(f"{where}: the Mosaic GPU kernels have no ALiBi bias; use the Triton ones")
    stages = num_stages or default_launch(padded_head_dim)[1]
    needed = (shared_memory_bytes(kernel, dtype, padded_head_dim, block, stages, held)
              + barrier_bytes(kernel, stages, held))
    if needed > H100_SHARED_MEMORY_BYTES:
        raise ValueError(f"{where}: the Mosaic GPU {name}'s tiles need {needed:,} B of shared memory at {block_name} "
                         f"{block}, head_dim {padded_head_dim} and {stages} stages, more than an H100's "
                         f"{H100_SHARED_MEMORY_BYTES:,} B per block: fewer stages or a smaller {block_name}")


def check_kernels(where: str, kernels, *, dtype, padded_head_dim: int, alibi: bool, tiles: dict, asked: dict) -> None:
    """check_supported for each of kernels (names in TILES) at pallas_gpu_attention's resolved tiles; asked: the
    num_warps / num_stages arguments as given (None where left to the defaults)."""
    for kernel in kernels:
        held, block = (tiles[name] for name in TILES[kernel])
        prefix = LAUNCH_PREFIX[kernel]
        check_supported(where, kernel, dtype=dtype, padded_head_dim=padded_head_dim, alibi=alibi, held=held,
                        block=block, num_warps=asked.get(prefix + "num_warps"),
                        num_stages=asked.get(prefix + "num_stages"))


def tile_transforms(dtype):
    """Shared-memory layout wgmma reads: 8-row tiles of one 128-byte swizzle width."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    columns = SWIZZLE_BYTES // jnp.dtype(dtype).itemsize
    return plgpu.TilingTransform((8, columns)), plgpu.SwizzleTransform(SWIZZLE_BYTES)


def product(a, b, shape: tuple[int, int], staging=None):
    """a @ b on the tensor cores (wgmma), float32 [shape]: a a shared-memory tile or a 16-bit array in registers,
    b a shared-memory tile (`.T` of one for a transposed operand). staging: for a register operand in interpret
    mode, whose wgmma reads both operands from shared memory, the shared-memory tile it goes through; else None."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    if staging is not None:
        staging[...] = a
        plgpu.commit_smem()
        a = staging

    def run(acc_ref):
        plgpu.wgmma(acc_ref, a, b)
        return acc_ref[...]

    return pl.run_scoped(run, plgpu.ACC(shape, jnp.float32))


def tile_visible(row_seg, column_seg, row_first, column_first, half: int | None, shape: tuple[int, int]):
    """The [rows, columns] mask of one wgmma tile (pallas_gpu_attention's `_visible` on either side of the
    transposition): same non-padding segment and, for local attention, within the window. row_seg / column_seg:
    segment ids in the tile's row / column layouts."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    rows = lax.broadcast_in_dim(row_seg, shape, [0])
    visible = (rows == lax.broadcast_in_dim(column_seg, shape, [1])) & (rows != 0)
    if half is not None:
        row_pos = plgpu.broadcasted_iota(jnp.int32, shape, 0, layout=plgpu.Layout.WGMMA) + row_first
        column_pos = plgpu.broadcasted_iota(jnp.int32, shape, 1, layout=plgpu.Layout.WGMMA) + column_first
        visible = visible & (jnp.abs(row_pos - column_pos) <= half)
    return visible


def key_value_ring(k_ref, v_ref, k_smem, v_smem, k_barriers, v_barriers, *, b, kv_head, block: int, lo, hi,
                   num_stages: int):
    """Start the ring of key and value tiles (blocks lo, lo + 1, ... into slots 0, 1, ...) of a program that visits
    key blocks [lo, hi), and return fetch(j, slot), which copies block j into a slot once its tiles are read."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    def fetch(j, slot):
        keys = pl.ds(j * block, block)
        plgpu.copy_gmem_to_smem(k_ref.at[b, keys, kv_head], k_smem.at[slot], k_barriers.at[slot])
        plgpu.copy_gmem_to_smem(v_ref.at[b, keys, kv_head], v_smem.at[slot], v_barriers.at[slot])

    for step in range(num_stages):
        pl.when(lo + step < hi)(functools.partial(fetch, lo + step, step))
    return fetch


def tile_layouts():
    """(rows, columns): the layouts of one value per row and per column of a [64, n] wgmma tile."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA.reduce(0)


def _attend(q_tile, q_first, seg_ref, b, ranges, k_smem, v_smem, k_barriers, v_barriers, staging, keys_read,
            values_read, *, scale: float, half: int | None, block_k: int, num_stages: int):
    """One warpgroup's flash loop over the key blocks in ranges (lo, full_lo, full_hi, hi) for the 64 queries from
    q_first in q_tile (shared memory), their key and value tiles waited for in the ring's slots; keys_read(j, slot)
    and values_read(j, slot) run once block j's key / value tile is read. Returns (acc, m, l)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    lo, full_lo, full_hi, hi = ranges
    rows, columns = tile_layouts()
    q_seg = plgpu.load(seg_ref.at[b, pl.ds(q_first, BLOCK_Q)], layout=rows, optimized=False)
    factor = scale * LOG2E

    def body(masked: bool):
        def step(j, carry):
            acc, m, l = carry
            slot = lax.rem(j - lo, jnp.int32(num_stages))
            plgpu.barrier_wait(k_barriers.at[slot])
            s = product(q_tile, k_smem.at[slot].T, (BLOCK_Q, block_k))
            keys_read(j, slot)
            if masked:
                k_seg = plgpu.load(seg_ref.at[b, pl.ds(j * block_k, block_k)], layout=columns, optimized=False)
                visible = tile_visible(q_seg, k_seg, q_first, j * block_k, half, (BLOCK_Q, block_k))
                s = jnp.where(visible, s, -jnp.inf)
            # The Triton kernel's online softmax step (online_softmax_step), on wgmma tiles: the row max is taken
            # before scaling and the scaling folded into the exponent.
            m_new = jnp.maximum(m, s.max(axis=1) * factor)
            m_safe = jnp.where(m_new > 0.5 * MASK_VALUE, m_new, 0.0)
            p = jnp.exp2(s * factor - lax.broadcast_in_dim(m_safe, s.shape, [0]))
            alpha = jnp.exp2(m - m_safe)
            plgpu.barrier_wait(v_barriers.at[slot])
            pv = product(p.astype(v_smem.dtype), v_smem.at[slot], (BLOCK_Q, acc.shape[1]), staging)
            values_read(j, slot)
            acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0]) + pv
            return acc, m_new, l * alpha + p.sum(axis=1)
        return step

    head_dim = q_tile.shape[-1]
    init = (plgpu.layout_cast(jnp.zeros((BLOCK_Q, head_dim), jnp.float32), plgpu.Layout.WGMMA),
            plgpu.layout_cast(jnp.full((BLOCK_Q,), MASK_VALUE, jnp.float32), rows),
            plgpu.layout_cast(jnp.zeros((BLOCK_Q,), jnp.float32), rows))
    return three_loops(lo, full_lo, full_hi, hi, body, init)


def _write_rows(acc, m, l, o_tile, lse_row, o_destination, lse_destination):
    """finish_softmax's rule (a row with no visible key, padding, gets output 0 and log-sum-exp 0), through shared
    memory to the output and log-sum-exp in HBM."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    empty = l == 0.0
    safe_l = jnp.where(empty, 1.0, l)
    o_tile[...] = (acc / lax.broadcast_in_dim(safe_l, acc.shape, [0])).astype(o_tile.dtype)
    lse_row[...] = jnp.where(empty, 0.0, m * LN2 + jnp.log(safe_l))
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_tile, o_destination)
    plgpu.copy_smem_to_gmem(lse_row, lse_destination)
    plgpu.wait_smem_to_gmem(0)


def _ignore(j, slot):
    del j, slot


def _kernel(lo_ref, full_lo_ref, full_hi_ref, hi_ref, seg_ref, q_ref, k_ref, v_ref, o_ref, lse_ref,
            q_smem, k_smem, v_smem, o_smem, lse_smem, q_barrier, k_barriers, v_barriers, p_smem=None, *, scale: float,
            half: int | None, block_k: int, num_stages: int, group: int):
    """block_q 64: one warpgroup holds the query tile and refills the ring itself."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    h, i, b = lax.axis_index("heads"), lax.axis_index("q_blocks"), lax.axis_index("batch")
    kv_head = lax.div(h, jnp.int32(group))
    q_first = i * BLOCK_Q
    ranges = lo_ref[b, i], full_lo_ref[b, i], full_hi_ref[b, i], hi_ref[b, i]
    plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(q_first, BLOCK_Q), h], q_smem, q_barrier)
    fetch = key_value_ring(k_ref, v_ref, k_smem, v_smem, k_barriers, v_barriers, b=b, kv_head=kv_head, block=block_k,
                           lo=ranges[0], hi=ranges[3], num_stages=num_stages)
    plgpu.barrier_wait(q_barrier)

    def refill(j, slot):  # both products have returned: the slot's tiles are read
        pl.when(j + num_stages < ranges[3])(functools.partial(fetch, j + num_stages, slot))

    acc, m, l = _attend(q_smem, q_first, seg_ref, b, ranges, k_smem, v_smem, k_barriers, v_barriers, p_smem, _ignore,
                        refill, scale=scale, half=half, block_k=block_k, num_stages=num_stages)
    _write_rows(acc, m, l, o_smem, lse_smem, o_ref.at[b, pl.ds(q_first, BLOCK_Q), h],
                lse_ref.at[b, h, pl.ds(q_first, BLOCK_Q)])


def _kernel_two_warpgroups(lo_ref, full_lo_ref, full_hi_ref, hi_ref, seg_ref, q_ref, k_ref, v_ref, o_ref, lse_ref,
                           q_smem, k_smem, v_smem, o_smem, lse_smem, q_barriers, k_barriers, v_barriers, k_free,
                           v_free, p_smem=None, *, scale: float, half: int | None, block_k: int, num_stages: int,
                           group: int):
    """block_q 128 (FlashAttention-3's layout): two consumer warpgroups hold 64 queries each and share every key and
    value tile, which a third, producer warpgroup copies in; a slot is refilled once both consumers have read it
    (k_free / v_free: two arrivals each). The block ranges are the 128-row block's, the same for both consumers, so
    they step through the ring together."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    h, i, b = lax.axis_index("heads"), lax.axis_index("q_blocks"), lax.axis_index("batch")
    wg = lax.axis_index("wg")
    kv_head = lax.div(h, jnp.int32(group))
    ranges = lo_ref[b, i], full_lo_ref[b, i], full_hi_ref[b, i], hi_ref[b, i]
    lo, hi = ranges[0], ranges[3]

    @pl.when(wg == 2)
    def _producer():
        plgpu.set_max_registers(40, action="decrease")

        @pl.loop(0, hi - lo)
        def _(t):
            slot = lax.rem(t, jnp.int32(num_stages))
            keys = pl.ds((lo + t) * block_k, block_k)

            @pl.when(t >= num_stages)
            def _():
                plgpu.barrier_wait(k_free.at[slot])
            plgpu.copy_gmem_to_smem(k_ref.at[b, keys, kv_head], k_smem.at[slot], k_barriers.at[slot])

            @pl.when(t >= num_stages)
            def _():
                plgpu.barrier_wait(v_free.at[slot])
            plgpu.copy_gmem_to_smem(v_ref.at[b, keys, kv_head], v_smem.at[slot], v_barriers.at[slot])

        # The last num_stages slots' releases too: a program ends with every barrier phase observed by the thread
        # that waits on it (JAX's interpret mode checks this when the barriers are freed).
        @pl.loop(jnp.maximum(hi - lo - num_stages, 0), hi - lo)
        def _(t):
            slot = lax.rem(t, jnp.int32(num_stages))
            plgpu.barrier_wait(k_free.at[slot])
            plgpu.barrier_wait(v_free.at[slot])

    @pl.when(wg < 2)
    def _consumer():
        plgpu.set_max_registers(232, action="increase")
        q_first = i * (2 * BLOCK_Q) + wg * BLOCK_Q
        q_tile = q_smem.at[wg]
        plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(q_first, BLOCK_Q), h], q_tile, q_barriers.at[wg])
        plgpu.barrier_wait(q_barriers.at[wg])
        acc, m, l = _attend(q_tile, q_first, seg_ref, b, ranges, k_smem, v_smem, k_barriers, v_barriers,
                            None if p_smem is None else p_smem.at[wg],
                            lambda j, slot: plgpu.barrier_arrive(k_free.at[slot]),
                            lambda j, slot: plgpu.barrier_arrive(v_free.at[slot]),
                            scale=scale, half=half, block_k=block_k, num_stages=num_stages)
        _write_rows(acc, m, l, o_smem.at[wg], lse_smem.at[wg], o_ref.at[b, pl.ds(q_first, BLOCK_Q), h],
                    lse_ref.at[b, h, pl.ds(q_first, BLOCK_Q)])


INTERPRET_FROM_JAX = (0, 11)  # JAX 0.10 has the interpret module, but its Mosaic GPU loads take other arguments


def interpret_params():
    """JAX's Mosaic GPU interpret mode (JAX >= 0.11): the kernel's copies, barriers and wgmma simulated on CPU."""
    unable = ValueError(
        f"the Mosaic GPU attention kernels (attention_implementation='pallas_gpu_mosaic') run in interpret mode "
        f"(attention_interpret=True) from JAX {'.'.join(map(str, INTERPRET_FROM_JAX))}; this is {jax.__version__}: "
        "interpret the Triton kernels instead (attention_implementation='pallas_gpu'), or run on a Hopper GPU")
    if tuple(int(part) for part in jax.__version__.split(".")[:2]) < INTERPRET_FROM_JAX:
        raise unable
    try:
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    except ImportError:  # pragma: no cover - depends on the installed JAX
        raise unable from None
    return InterpretGPUParams()


def mosaic_forward(q, k, v, seg, *, scale: float, half: int | None, block_k: int, num_stages: int,
                   interpret: bool, block_q: int = BLOCK_Q):
    """(out [batch, seq, heads, head_dim], lse float32 [batch, heads, seq]) of q [batch, seq, heads, head_dim] and
    k, v [batch, seq, kv_heads, head_dim]; seq a multiple of block_q and block_k, segment ids padded alike.
    block_q 64: one warpgroup per program; 128: two consumer warpgroups and a producer (`_kernel_two_warpgroups`)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    batch, seq, heads, head_dim = q.shape
    group = heads // k.shape[2]
    consumers = block_q // BLOCK_Q
    ranges = block_ranges(seg, None if half is None else 2 * half, block_q, block_k)
    transforms = tile_transforms(q.dtype)
    tile = lambda rows, *lead: plgpu.SMEM((*lead, rows, head_dim), q.dtype, transforms=transforms)
    held = (consumers,) if consumers > 1 else ()
    # Interpret mode's wgmma cannot take p from registers; on a GPU it never leaves them.
    staging = [plgpu.SMEM((*held, BLOCK_Q, block_k), q.dtype, transforms=transforms)] if interpret else []
    ring = (tile(block_k, num_stages), tile(block_k, num_stages))
    if consumers == 1:
        kernel, scratch, threads = _kernel, (tile(BLOCK_Q), *ring, tile(BLOCK_Q), plgpu.SMEM((BLOCK_Q,), jnp.float32),
                                             plgpu.Barrier(), plgpu.Barrier(num_barriers=num_stages),
                                             plgpu.Barrier(num_barriers=num_stages)), {}
    else:
        free = plgpu.Barrier(num_arrivals=consumers, num_barriers=num_stages)
        kernel = _kernel_two_warpgroups
        scratch = (tile(BLOCK_Q, consumers), *ring, tile(BLOCK_Q, consumers),
                   plgpu.SMEM((consumers, BLOCK_Q), jnp.float32), plgpu.Barrier(num_barriers=consumers),
                   plgpu.Barrier(num_barriers=num_stages), plgpu.Barrier(num_barriers=num_stages), free, free)
        threads = dict(num_threads=consumers + 1, thread_name="wg")
    call = plgpu.kernel(
        functools.partial(kernel, scale=scale, half=half, block_k=block_k, num_stages=num_stages, group=group),
        out_type=(jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((batch, heads, seq), jnp.float32)),
        scratch_types=(*scratch, *staging),
        grid=(heads, seq // block_q, batch),
        grid_names=("heads", "q_blocks", "batch"),
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=interpret_params() if interpret else None,
        **threads,
    )
    return call(*ranges, seg, q, k, v)


def forward(q, k, v, seg, slopes, st):
    """pallas_gpu_attention's FORWARD_KERNELS entry: its _Static's scale, window, block_k and num_stages."""
    del slopes  # ALiBi is refused before tracing (check_kernels)
    return mosaic_forward(q, k, v, seg, scale=st.scale, half=st.half, block_k=st.block_k, num_stages=st.num_stages,
                          interpret=st.interpret, block_q=st.block_q)


def pallas_gpu_mosaic_attention(q, k, v, **arguments):
    """The registry's "pallas_gpu_mosaic": `pallas_gpu_attention` with every kernel in Mosaic GPU (this forward,
    mosaic_gpu_attention_backward's dq and dk/dv)."""
    return pallas_gpu_attention(q, k, v, forward_kernel="mosaic", backward_kernel="mosaic", **arguments)
