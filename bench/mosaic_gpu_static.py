"""What the Pallas Mosaic GPU forward (bertjax/ops/mosaic_gpu_attention.py) compiles to for an H100, without a GPU:
per setting, ptxas's registers per thread and spills for sm_90a, the shared memory Mosaic GPU allocates, the
programs an SM holds at once, and the PTX instructions of each key-block loop body per thread (exponentials,
fused multiply-adds, selects), as bench.pallas_gpu_static reports them for the Triton kernels.

    pip install "jax[cuda13]"      # JAX's CUDA plugin: Mosaic GPU compiles with its ptxas, no GPU needed
    python -m bench.mosaic_gpu_static [--layers global local] [--head-dims 64 128] [--block-ks 64 128]
                                      [--stages 2 3]

Mosaic GPU writes what it compiled where MOSAIC_GPU_DUMP_TO points (PTX, the ptxas log, its resource count); this
sets those variables for one compile at a time and reads the files back.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import tempfile

import jax
import jax.numpy as jnp

from bench.pallas_gpu_static import blocks_per_sm, loop_bodies

PTXAS = {"registers": re.compile(r"Used (\d+) registers"), "spill_stores": re.compile(r"(\d+) bytes spill stores"),
         "spill_loads": re.compile(r"(\d+) bytes spill loads")}
SHARED = re.compile(r"smem_scratch_bytes=(\d+)")


def compile_forward(layer: str, head_dim: int, block_k: int, num_stages: int, seq: int = 1024) -> dict:
    """Compile one setting for an H100 and return what Mosaic GPU dumped: registers, spills, shared memory, PTX."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from bertjax import gpu_aot
    from bertjax.ops.mosaic_gpu_attention import mosaic_forward

    sharding = NamedSharding(Mesh(gpu_aot.gpu_devices("h100"), ("d",)), PartitionSpec())
    array = jax.ShapeDtypeStruct((1, seq, 12, head_dim), jnp.bfloat16, sharding=sharding)
    segments = jax.ShapeDtypeStruct((1, seq), jnp.int32, sharding=sharding)
    half = None if layer == "global" else 64
    fn = jax.jit(lambda q, k, v, s: mosaic_forward(q, k, v, s, scale=0.125, half=half, block_k=block_k,
                                                   num_stages=num_stages, interpret=False))
    with tempfile.TemporaryDirectory() as folder:
        names = ("MOSAIC_GPU_DUMP_TO", "MOSAIC_GPU_DUMP_PTX", "MOSAIC_GPU_DUMP_PTXAS", "MOSAIC_GPU_DUMP_RESOURCES")
        saved = {name: os.environ.get(name) for name in names}
        os.environ.update(dict(zip(names, (folder, "1", "1", "1"))))
        try:
            fn.lower(array, array, array, segments).compile()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        dumped = {suffix: "".join(open(os.path.join(folder, file)).read() for file in sorted(os.listdir(folder))
                                  if file.endswith(suffix)) for suffix in (".ptx", ".ptxas", ".resources.txt")}
    log = dumped[".ptxas"]
    found = {key: pattern.search(log) for key, pattern in PTXAS.items()}
    shared = SHARED.search(dumped[".resources.txt"])
    if not all(found.values()) or shared is None:
        raise RuntimeError(f"Mosaic GPU dumped no ptxas report or resource count (jax {jax.__version__}):\n{log}")
    return {**{key: int(match.group(1)) for key, match in found.items()}, "shared": int(shared.group(1)),
            "ptx": dumped[".ptx"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", nargs="+", choices=["global", "local"], default=["global", "local"])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--block-ks", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--stages", nargs="+", type=int, default=[2, 3])
    args = parser.parse_args(argv)
    from bertjax.ops.mosaic_gpu_attention import check_supported

    print(f"# Mosaic GPU forward (bfloat16, block_q 64, one warpgroup), jax {jax.__version__}, sm_90a; local: window "
          f"128")
    print("| layer | head_dim | block_k | stages | registers | spill stores / loads (B) | shared memory (B) | "
          "blocks / SM | loop: instructions, ex2, fma, selp (masked / unmasked / masked) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for layer, head_dim, block_k, stages in itertools.product(args.layers, args.head_dims, args.block_ks,
                                                               args.stages):
        try:
            check_supported("mosaic_gpu_static", dtype=jnp.bfloat16, padded_head_dim=head_dim, alibi=False,
                            block_q=64, block_k=block_k, num_stages=stages)
        except ValueError as error:
            print(f"| {layer} | {head_dim} | {block_k} | {stages} | refused: {error} |||||")
            continue
        found = compile_forward(layer, head_dim, block_k, stages)
        bodies = loop_bodies(found["ptx"])
        loops = " / ".join(f"{b['all']}, {b['ex2']}, {b['fma']}, {b['selp']}" for b in bodies)
        print(f"| {layer} | {head_dim} | {block_k} | {stages} | {found['registers']} | {found['spill_stores']} / "
              f"{found['spill_loads']} | {found['shared']:,} | "
              f"{blocks_per_sm(4, found['registers'], found['shared'])} | {loops} |")


if __name__ == "__main__":
    main()
