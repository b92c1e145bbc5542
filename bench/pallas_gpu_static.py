"""What the Pallas GPU attention kernels compile to for an H100, without a GPU: each kernel's Triton IR (taken from
the program lowered for CUDA) compiled for sm_90 by the `triton` package, then its shared memory, whether the tile
products use Hopper's wgmma, and the PTX instructions of each key-block (or query-block) loop body per thread:
exponentials, fused multiply-adds, selects and compares, which bound the kernel at head_dim 64 (docs/benchmarks.md);
and what ptxas (shipped in the `triton` package) reports per kernel: registers per thread, stack frame and spills.

    pip install triton            # the compiler only; no GPU needed
    python -m bench.pallas_gpu_static [--layer global|local] [--dtype bfloat16|float32] [--head-dim 64]
                                      [--block-q 64] [--block-k 64] [--num-warps N] [--num-stages 2]
                                      [--backward-block-q N] [--backward-block-k N] [--backward-num-warps N]
                                      [--backward-num-stages N]   # dq and dk/dv; default: the forward's
                                      [--dkv-block-q N] [--dkv-block-k N] [--dkv-num-warps N]
                                      [--dkv-num-stages N]        # dk/dv alone; default: --backward-*
    python -m bench.pallas_gpu_static --kernel deberta [--dtype ...] [--seq 512] [--block-size 32] [--num-warps N]
                                      [--num-stages 2] [--band-part 16] [--backward-block 16]
        # DeBERTa-v3-base's disentangled attention (pallas_gpu_disentangled: 12 heads x 64, 256 buckets, span
        # 256, max_position 512): forward, dq and dk/dv with their tile sides; --band-part,
        # --backward-block, --backward-tile-area override the module's BAND_PART, BACKWARD_BLOCK, BACKWARD_TILE_AREA
    python -m bench.pallas_gpu_static --stacked [--layer ...] [--num-stages 3] [--backward-* / --dkv-* N]
        # attention on the stacked q/k/v
    python -m bench.pallas_gpu_static --backward-kernel triton_atomic [--stacked] [--layer ...] [--dkv-* N]
        # the one-pass backward (dq added with atomics) in place of dq and dk/dv
    python -m bench.pallas_gpu_static --kernel norm [--features 768] [--dtype ...] [--block-rows N] [--num-warps N]
        # the residual add + norm kernels (pallas_gpu_norm), forward and backward, LayerNorm without bias as
        # ModernBERT's: a memory-bound kernel wants enough resident programs and no spills
    python -m bench.pallas_gpu_static --kernel glu [--features 1152] [--dtype ...] [--activation gelu]
                                      [--block-rows 32] [--block-cols 128] [--num-warps 4]
        # the gated MLP's act(a) * b kernels (pallas_gpu_glu), forward and backward, modernbert-base's width

A thread has at most 255 registers; a kernel at that limit with a stack frame or spills keeps part of its state in
local memory (L1, else DRAM) instead.

A loop body is a PTX basic block with at least 16 exponentials (a 64 x 64 tile over 128 threads has 32 per
thread). Each kernel has three: masked / unmasked / masked over the fully visible tiles (pallas_gpu_attention's
`three_loops`); a kernel whose row shows one loop is an older build. The pip Triton is a proxy for the compiler
inside XLA (another build, same project): counts are comparable between kernel versions, not cycle-exact. jaxlib
versions that compile Triton while lowering keep no Triton IR in the HLO: then this says so and stops.
"""

from __future__ import annotations

import argparse
import collections
import functools
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.ops.pallas_gpu_attention import key_block_ranges, pallas_gpu_attention

# The custom call that carries a Pallas Triton kernel (the Triton IR, for XLA to compile); jaxlib 0.10.2 also
# holds a path, unused there, that compiles while lowering and calls the binary through an FFI target.
TRITON_CALLS = ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi")
# Lowering errors of JAX versions that ask the local GPU for its compute capability (0.11: "No supported GPU
# devices found" / "Unsupported GPU device kind") or compile Triton while lowering: no GPU here, not a kernel bug.
NEEDS_A_GPU = re.compile(r"No supported GPU devices|Unsupported GPU device kind|Triton compilation handler|"
                         r"Cannot infer architecture")


def abstract_h100_mesh(shape: tuple[int, ...] = (1,), names: tuple[str, ...] = ("data",)):
    """An abstract mesh of H100s (no devices needed): JAX >= 0.11 reads the GPU kind from it while lowering Triton,
    and any JAX exports a sharded program for it (`jax.sharding.use_abstract_mesh`)."""
    from jax._src.mesh import AbstractDevice  # no public name yet; JAX's error message points to it
    from jax.sharding import AbstractMesh, AxisType

    device = AbstractDevice(device_kind="NVIDIA H100 80GB HBM3", num_cores=None, platform="gpu")
    return AbstractMesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), abstract_device=device)


def abstract_h100():
    """Lowering on one abstract H100 (see abstract_h100_mesh)."""
    return jax.sharding.use_abstract_mesh(abstract_h100_mesh())


def triton_ir(fn, *args) -> list[tuple[str, str, int, int]] | None:
    """(kernel name, Triton IR as text, num_warps, num_stages) of every Triton call in jit(fn) lowered for CUDA (on
    an abstract H100 where this JAX needs a GPU to lower: NEEDS_A_GPU), or None where the HLO carries no Triton IR."""
    try:
        from jaxlib.triton import dialect as triton_dialect
    except ImportError:
        return None
    from jax._src.lib.mlir import ir

    lower = lambda: jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).compiler_ir("stablehlo")
    try:
        module = lower()
    except (RuntimeError, ValueError) as error:
        if not NEEDS_A_GPU.search(str(error)):
            raise
        with abstract_h100():
            module = lower()
    configs = []

    def visit(op):
        op = op.operation
        if (op.name == "stablehlo.custom_call"
                and ir.StringAttr(op.attributes["call_target_name"]).value in TRITON_CALLS):
            configs.append(ir.DictAttr(op.attributes["mhlo.backend_config"]))
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    visit(inner)

    with module.context:
        visit(module.operation)
        if not configs or "ir" not in configs[0]:
            return None
        raw = [(ir.StringAttr(c["name"]).value, ir.StringAttr(c["ir"]).value_bytes,
                ir.IntegerAttr(c["num_warps"]).value, ir.IntegerAttr(c["num_stages"]).value) for c in configs]
    context = ir.Context()
    triton_dialect.register_dialect(context)
    with context:
        return [(name, ir.Module.parse(blob).operation.get_asm(), warps, stages) for name, blob, warps, stages in raw]


def compile_for_sm90(name: str, text: str, warps: int, stages: int):
    """The `triton` package's compilation of one kernel's IR for sm_90 (an H100). Multiply-adds fused, as every number
    in docs/benchmarks.md was taken (triton 3.9's default; 3.10 changes the default to off)."""
    import triton
    from triton.backends.compiler import GPUTarget

    with tempfile.NamedTemporaryFile("w", suffix=".ttir", prefix=f"{name}-") as file:
        file.write(text)
        file.flush()
        return triton.compile(file.name, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages, "enable_fp_fusion": True})


PTXAS_REPORT = {
    "registers": re.compile(r"Used (\d+) registers"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
}


def ptxas_resources(ptx: str) -> dict[str, int]:
    """Registers per thread, stack frame and spill bytes of a kernel's PTX, from `ptxas -v` for sm_90a: the pip
    Triton leaves `n_regs` / `n_spills` unset without a GPU (they come from loading the cubin), so this runs the
    ptxas Triton itself compiles with, with the options that change allocation (its make_cubin's)."""
    import subprocess

    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as folder:
        source = f"{folder}/kernel.ptx"
        with open(source, "w") as file:
            file.write(ptx)
        log = subprocess.run([get_ptxas(90).path, "-v", "--regAllocOptLevel=2", "--gpu-name=sm_90a", source, "-o",
                              f"{folder}/kernel.cubin"], check=True, capture_output=True, text=True).stderr
    found = {key: pattern.search(log) for key, pattern in PTXAS_REPORT.items()}
    if not all(found.values()):
        raise RuntimeError(f"unexpected ptxas report:\n{log}")
    return {key: int(match.group(1)) for key, match in found.items()}


# An H100 SM (compute capability 9.0): 64K registers, allocated per warp in units of 256 (8 per thread); 228 KB of
# shared memory, of which the system reserves 1 KB per resident block; at most 64 resident warps.
SM_REGISTERS, SM_SHARED_BYTES, SM_WARPS = 65_536, 233_472, 64


def blocks_per_sm(warps: int, registers: int, shared: int) -> int:
    """Programs of one kernel resident per H100 SM at once, as registers, shared memory and warps allow: more
    registers per thread only cost time where they lower this (or spill)."""
    per_warp = -(-registers // 8) * 8 * 32
    return min(SM_REGISTERS // (per_warp * warps), SM_SHARED_BYTES // (shared + 1024), SM_WARPS // warps)


def loop_bodies(ptx: str, min_exponentials: int = 16) -> list[collections.Counter]:
    """Opcode counts (ex2, fma, selp, ...) of each PTX basic block holding at least `min_exponentials` ex2: the
    kernels' tile loops, per thread."""
    blocks, current = [], collections.Counter()
    for line in ptx.splitlines():
        if re.match(r"^\$L__BB\d+_\d+:", line):
            blocks.append(current)
            current = collections.Counter()
        elif re.match(r"^\s+(@!?%p\d+\s+)?[a-z]", line):
            opcode = re.sub(r"^\s*@!?%p\d+\s+", "", line).split()[0].split(".")[0]
            current[opcode] += 1
            current["all"] += 1
    blocks.append(current)
    return [block for block in blocks if block["ex2"] >= min_exponentials]


def attention_gradient(layer: str, block_q: int, block_k: int, num_warps, num_stages: int, **backward):
    """Forward and backward of one attention call: lowering it yields all three kernels. `backward`: the
    backward_* and dkv_* settings of pallas_gpu_attention."""
    kernel = functools.partial(pallas_gpu_attention, block_q=block_q, block_k=block_k, num_warps=num_warps,
                               num_stages=num_stages, **backward)

    def loss(q, k, v, segment_ids):
        out = kernel(q, k, v, segment_ids=segment_ids, local_window=None if layer == "global" else 128,
                     scale=0.125)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    return jax.grad(loss, argnums=(0, 1, 2))


def stacked_gradient(layer: str, block_q: int, block_k: int, num_warps, num_stages: int, **backward):
    """Like attention_gradient, for attention on the stacked q/k/v projection (pallas_gpu_rope_attention): the same
    three kernels reading v from the stack, the backward's two writing its gradient with RoPE's backward."""
    from bertjax.ops.pallas_gpu_attention import pallas_gpu_rope_attention

    def loss(qkv, positions, segment_ids):
        out = pallas_gpu_rope_attention(qkv, positions, 10_000.0, segment_ids=segment_ids,
                                        local_window=None if layer == "global" else 128, scale=0.125,
                                        block_q=block_q, block_k=block_k, num_warps=num_warps,
                                        num_stages=num_stages, **backward)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    return jax.grad(loss)


DEBERTA_V3_BASE = dict(heads=12, head_dim=64, span=256, buckets=256, max_position=512)


def deberta_gradient(seq: int, block_size: int, num_warps, num_stages: int):
    """jit-able gradient of DeBERTa-v3-base's disentangled attention on the Pallas GPU kernel (heads-first layout,
    both relative terms), and its abstract arguments at batch 1: lowering it yields the forward, dq and dk/dv."""
    from bertjax.ops.disentangled_attention import relative_index
    from bertjax.ops.pallas_gpu_disentangled import pallas_gpu_disentangled

    shape = DEBERTA_V3_BASE
    table = relative_index(seq, seq, shape["span"], shape["buckets"], shape["max_position"])
    segment_ids = jnp.ones((1, seq), jnp.int32)

    def loss(q, k, v, pos_key, pos_query):
        out = pallas_gpu_disentangled(q, k, v, pos_key, pos_query, segment_ids=segment_ids, table=table,
                                      scale=1.0 / np.sqrt(3 * shape["head_dim"]), block_size=block_size,
                                      num_warps=num_warps, num_stages=num_stages)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    return jax.grad(loss, argnums=(0, 1, 2, 3, 4))


def resource_row(name: str, text: str, warps: int, stages: int, tile: str = ""):
    """One kernel compiled for sm_90: its markdown table row (see main's header) and the compiled kernel."""
    compiled = compile_for_sm90(name, text, warps, stages)
    ptx = compiled.asm["ptx"]
    used = ptxas_resources(ptx)
    # Hopper's wgmma needs 64 rows per warpgroup; a smaller side falls back to Ampere's mma.sync.
    products = f"{ptx.count('wgmma.mma_async')} / {ptx.count('mma.sync')}"
    shared = compiled.metadata.shared
    row = (f"| {name} | {warps} | {stages} | {tile}{shared:,} | {used['registers']} | {used['stack']} | "
           f"{used['spill_stores']} / {used['spill_loads']} | {products} | "
           f"{blocks_per_sm(warps, used['registers'], shared)} |")
    return row, compiled


def deberta_main(args) -> None:
    from bertjax.ops import pallas_gpu_disentangled as kernel

    # Trying settings: the module reads these constants while tracing, so setting them here reaches all kernels.
    if args.band_part is not None:
        kernel.BAND_PART = args.band_part
    if args.backward_block is not None:
        kernel.BACKWARD_BLOCK = args.backward_block
    if args.backward_tile_area is not None:
        kernel.BACKWARD_TILE_AREA = args.backward_tile_area
    shape = DEBERTA_V3_BASE
    dtype = jnp.dtype(args.dtype)
    q = jax.ShapeDtypeStruct((1, shape["heads"], args.seq, shape["head_dim"]), dtype)
    pos = jax.ShapeDtypeStruct((2 * shape["span"], shape["heads"], shape["head_dim"]), dtype)
    kernels = triton_ir(deberta_gradient(args.seq, args.block_size, args.num_warps, args.num_stages),
                        q, q, q, pos, pos)
    if kernels is None:
        raise SystemExit(f"jax {jax.__version__}: the lowered program carries no Triton IR to compile here")
    block = min(args.block_size, kernel.DEFAULT_BLOCK)
    width = 2 * shape["span"]  # a power of two here: the tables' padded width
    sides = {"bertjax_disentangled_forward": block}
    sides["bertjax_disentangled_dq"] = sides["bertjax_disentangled_dkv"] = kernel.backward_tile(block, width)
    print(f"# pallas_gpu_disentangled, {shape['heads']} heads x {shape['head_dim']}, {shape['buckets']} buckets, "
          f"span {shape['span']}, tables {width} wide, seq {args.seq}, {args.dtype}, block_size {args.block_size}, "
          f"BAND_PART {kernel.BAND_PART}; triton for sm_90")
    print("| kernel | warps | stages | tile side | shared memory (B) | registers | stack (B) | "
          "spill stores / loads (B) | wgmma / mma.sync | blocks / SM |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, text, warps, stages in kernels:
        print(resource_row(name, text, warps, stages, tile=f"{sides[name]} | ")[0], flush=True)


def norm_main(args) -> None:
    from bertjax.ops.pallas_gpu_norm import add_normalize

    dtype = jnp.dtype(args.dtype)
    x = jax.ShapeDtypeStruct((32 * 1024, args.features), dtype)
    scale = jax.ShapeDtypeStruct((args.features,), jnp.float32)

    def loss(x, delta, scale):
        s, y = add_normalize(x, delta, scale, None, epsilon=1e-5, centered=True, dtype=dtype,
                             block_rows=args.block_rows, num_warps=args.num_warps)
        return jnp.sum(s.astype(jnp.float32)) + jnp.sum(y.astype(jnp.float32))

    print_resources(triton_ir(jax.grad(loss, argnums=(0, 1, 2)), x, x, scale),
                    f"# pallas_gpu_norm, 32,768 rows x {args.features} features, {args.dtype}, block_rows "
                    f"{args.block_rows or 'default'}; triton for sm_90")


def print_resources(kernels, title: str) -> None:
    """A memory-bound kernel's table: shared memory, registers, spills and resident programs per kernel."""
    if kernels is None:
        raise SystemExit(f"jax {jax.__version__}: the lowered program carries no Triton IR to compile here")
    print(title)
    print("| kernel | warps | stages | shared memory (B) | registers | stack (B) | spill stores / loads (B) | "
          "wgmma / mma.sync | blocks / SM |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, text, warps, stages in kernels:
        print(resource_row(name, text, warps, stages)[0], flush=True)


def glu_main(args) -> None:
    from bertjax.ops import pallas_gpu_glu

    dtype = jnp.dtype(args.dtype)
    features = args.features if args.features is not None else 1152
    tiles = dict(block_rows=args.block_rows or pallas_gpu_glu.DEFAULT_BLOCK_ROWS,
                 block_cols=args.block_cols or pallas_gpu_glu.DEFAULT_BLOCK_COLS, num_warps=args.num_warps or 4)

    def loss(y):
        return jnp.sum(pallas_gpu_glu.glu(y, args.activation, **tiles).astype(jnp.float32))

    # value_and_grad: the backward needs none of the forward's output, so a gradient alone would drop the forward.
    print_resources(triton_ir(jax.value_and_grad(loss), jax.ShapeDtypeStruct((32 * 1024, 2, features), dtype)),
                    f"# pallas_gpu_glu, {args.activation}, 32,768 rows x 2 x {features} features, {args.dtype}, "
                    f"{tiles}; triton for sm_90")


def scored_pairs(window: int | None, seq: int, block_q: int, block_k: int) -> int:
    """(query, key) pairs a kernel tiled block_q x block_k scores over one document of `seq` tokens: visited tiles
    times tile area (key_block_ranges). Larger tiles skip less of a window's edge; the dk/dv kernel visits the same
    tiles as dq (the rule is symmetric)."""
    lo, hi = key_block_ranges(np.ones((1, seq), np.int32), window, block_q, block_k)
    return int(np.sum(np.asarray(hi) - np.asarray(lo))) * block_q * block_k


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", choices=["flash", "deberta", "norm", "glu"], default="flash")
    parser.add_argument("--layer", choices=["global", "local"], default="global")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-q", type=int, default=64)
    parser.add_argument("--block-k", type=int, default=64)
    parser.add_argument("--num-warps", type=int, default=None)
    parser.add_argument("--num-stages", type=int, default=2)
    for name in ("block-q", "block-k", "num-warps", "num-stages"):
        parser.add_argument(f"--backward-{name}", type=int, default=None, help="dq and dk/dv; default: the library's")
        parser.add_argument(f"--dkv-{name}", type=int, default=None, help="dk/dv alone; default: --backward-*'s")
    deberta = parser.add_argument_group("--kernel deberta")
    deberta.add_argument("--seq", type=int, default=512)
    deberta.add_argument("--block-size", type=int, default=32, help="the forward's tile side (pallas_gpu_disentangled)")
    deberta.add_argument("--band-part", type=int, default=None, help="override BAND_PART (one-hot cube width)")
    deberta.add_argument("--backward-block", type=int, default=None, help="override BACKWARD_BLOCK (backward tile cap)")
    deberta.add_argument("--backward-tile-area", type=int, default=None, help="override BACKWARD_TILE_AREA")
    parser.add_argument("--stacked", action="store_true",
                        help="attention on the stacked q/k/v projection (pallas_gpu_rope_attention)")
    parser.add_argument("--backward-kernel", choices=["triton", "triton_atomic"], default="triton",
                        help="triton_atomic: the one-pass backward (pallas_gpu_attention_one_pass: dq by atomics, on "
                             "the --dkv-* tiles) in place of dq and dk/dv")
    norm = parser.add_argument_group("--kernel norm")
    norm.add_argument("--features", type=int, default=None, help="default 768 (norm), 1152 (glu)")
    norm.add_argument("--block-rows", type=int, default=None, help="rows a program holds (default: the library's)")
    glu = parser.add_argument_group("--kernel glu (and --features, --block-rows)")
    glu.add_argument("--activation", default="gelu", help="a bertjax.ops.activations name")
    glu.add_argument("--block-cols", type=int, default=None, help="features a program holds (default: the library's)")
    args = parser.parse_args(argv)
    if args.kernel == "deberta":
        return deberta_main(args)
    if args.kernel == "norm":
        if args.features is None:
            args.features = 768
        return norm_main(args)
    if args.kernel == "glu":
        return glu_main(args)
    backward = {f"{prefix}_{name}": getattr(args, f"{prefix}_{name}") for prefix in ("backward", "dkv")
                for name in ("block_q", "block_k", "num_warps", "num_stages")
                if getattr(args, f"{prefix}_{name}") is not None}
    if args.backward_kernel != "triton":
        backward["backward_kernel"] = args.backward_kernel

    dtype = jnp.dtype(args.dtype)
    q = jax.ShapeDtypeStruct((2, 1024, 4, args.head_dim), dtype)
    rows = jax.ShapeDtypeStruct((2, 1024), jnp.int32)
    if args.stacked:
        kernels = triton_ir(stacked_gradient(args.layer, args.block_q, args.block_k, args.num_warps,
                                             args.num_stages, **backward),
                            jax.ShapeDtypeStruct((2, 1024, 3, 4, args.head_dim), dtype), rows, rows)
    else:
        kernels = triton_ir(attention_gradient(args.layer, args.block_q, args.block_k, args.num_warps,
                                               args.num_stages, **backward), q, q, q, rows)
    if kernels is None:
        raise SystemExit(f"jax {jax.__version__}: the lowered program carries no Triton IR to compile here")
    print(f"# pallas_gpu{' on the stacked q/k/v' if args.stacked else ''}, {args.layer} layer, {args.dtype}, "
          f"head_dim {args.head_dim}, forward tiles {args.block_q} "
          f"x {args.block_k}, num_stages {args.num_stages}, backward {backward or 'as the library defaults'}; "
          f"triton for sm_90")
    compiled = {}
    print("| kernel | warps | stages | shared memory (B) | registers | stack (B) | spill stores / loads (B) | "
          "wgmma / mma.sync | blocks / SM |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, text, warps, stages in kernels:
        row, compiled[name] = resource_row(name, text, warps, stages)
        print(row)
    window = None if args.layer == "global" else 128
    dq_tiles = (backward.get("backward_block_q", args.block_q), backward.get("backward_block_k", args.block_k))
    dkv_tiles = (backward.get("dkv_block_q", dq_tiles[0]), backward.get("dkv_block_k", dq_tiles[1]))
    print(f"\n# pairs scored over one 1024-token document (dense: {1024 * 1024:,}): forward "
          f"{scored_pairs(window, 1024, args.block_q, args.block_k):,}, dq {scored_pairs(window, 1024, *dq_tiles):,}, "
          f"dk/dv {scored_pairs(window, 1024, *dkv_tiles):,}")
    print("\n# PTX instructions per thread per tile")
    print("| kernel | loop | instructions | ex2 | fma | mul | selp | setp |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, binary in compiled.items():
        bodies = loop_bodies(binary.asm["ptx"])
        labels = ["masked", "unmasked", "masked"] if len(bodies) == 3 else [str(i) for i in range(len(bodies))]
        for label, body in zip(labels, bodies):
            print(f"| {name} | {label} | {body['all']} | {body['ex2']} | {body['fma']} | {body['mul']} | "
                  f"{body['selp']} | {body['setp']} |")


if __name__ == "__main__":
    main()
