"""What the Pallas GPU attention kernels compile to for an H100, without a GPU: each kernel's Triton IR (taken from
the program lowered for CUDA) compiled for sm_90 by the `triton` package, then its shared memory, whether the tile
products use Hopper's wgmma, and the PTX instructions of each key-block (or query-block) loop body per thread:
exponentials, fused multiply-adds, selects and compares, which bound the kernel at head_dim 64 (docs/benchmarks.md).

    pip install triton            # the compiler only; no GPU needed
    python -m bench.pallas_gpu_static [--layer global|local] [--dtype bfloat16|float32] [--head-dim 64]
                                      [--block-q 64] [--block-k 64] [--num-warps N] [--num-stages 2]

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

from bertjax.ops.pallas_gpu_attention import pallas_gpu_attention

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
    """The `triton` package's compilation of one kernel's IR for sm_90 (an H100)."""
    import triton
    from triton.backends.compiler import GPUTarget

    with tempfile.NamedTemporaryFile("w", suffix=".ttir", prefix=f"{name}-") as file:
        file.write(text)
        file.flush()
        return triton.compile(file.name, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "num_stages": stages})


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


def attention_gradient(layer: str, block_q: int, block_k: int, num_warps, num_stages: int):
    """Forward and backward of one attention call: lowering it yields all three kernels."""
    kernel = functools.partial(pallas_gpu_attention, block_q=block_q, block_k=block_k, num_warps=num_warps,
                               num_stages=num_stages)

    def loss(q, k, v, segment_ids):
        out = kernel(q, k, v, segment_ids=segment_ids, local_window=None if layer == "global" else 128,
                     scale=0.125)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    return jax.grad(loss, argnums=(0, 1, 2))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layer", choices=["global", "local"], default="global")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--block-q", type=int, default=64)
    parser.add_argument("--block-k", type=int, default=64)
    parser.add_argument("--num-warps", type=int, default=None)
    parser.add_argument("--num-stages", type=int, default=2)
    args = parser.parse_args(argv)

    dtype = jnp.dtype(args.dtype)
    q = jax.ShapeDtypeStruct((2, 1024, 4, args.head_dim), dtype)
    kernels = triton_ir(attention_gradient(args.layer, args.block_q, args.block_k, args.num_warps, args.num_stages),
                        q, q, q, jax.ShapeDtypeStruct((2, 1024), jnp.int32))
    if kernels is None:
        raise SystemExit(f"jax {jax.__version__}: the lowered program carries no Triton IR to compile here")
    print(f"# pallas_gpu, {args.layer} layer, {args.dtype}, head_dim {args.head_dim}, tiles {args.block_q} x "
          f"{args.block_k}, num_stages {args.num_stages}; triton for sm_90; PTX instructions per thread per tile")
    print("| kernel | warps | shared memory (B) | wgmma | loop | instructions | ex2 | fma | mul | selp | setp |")
    print("|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for name, text, warps, stages in kernels:
        compiled = compile_for_sm90(name, text, warps, stages)
        ptx = compiled.asm["ptx"]
        wgmma = "yes" if "wgmma.mma_async" in ptx else "no"
        bodies = loop_bodies(ptx)
        labels = ["masked", "unmasked", "masked"] if len(bodies) == 3 else [str(i) for i in range(len(bodies))]
        for label, body in zip(labels, bodies):
            print(f"| {name} | {warps} | {compiled.metadata.shared:,} | {wgmma} | {label} | {body['all']} | "
                  f"{body['ex2']} | {body['fma']} | {body['mul']} | {body['selp']} | {body['setp']} |")


if __name__ == "__main__":
    main()
