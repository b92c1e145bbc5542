"""What the Pallas Mosaic GPU attention kernels (bertjax/ops/mosaic_gpu_attention.py: forward;
mosaic_gpu_attention_backward.py: dq, dk/dv) compile to for an H100, without a GPU:
per setting, ptxas's registers per thread and spills for sm_90a, the shared memory Mosaic GPU allocates, the
programs an SM holds at once, and the PTX instructions of each key-block loop body per thread (exponentials,
fused multiply-adds, selects), as bench.pallas_gpu_static reports them for the Triton kernels.

    pip install "jax[cuda13]"      # JAX's CUDA plugin: Mosaic GPU compiles with its ptxas, no GPU needed
    python -m bench.mosaic_gpu_static [--kernels forward dq dkv] [--layers global local] [--head-dims 64 128]
                                      [--blocks 64 128] [--stages 2 3] [--forward-rows 64 128]

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


# (kernel, layer, head_dim, streamed rows, stages, seq, held rows) -> that kernel's dump files by suffix. jax >= 0.12
# compiles a Mosaic GPU kernel once per process: an identical kernel lowered again dumps its resource count but is
# not compiled, so it writes no .ptx or .ptxas, and from then on the two kinds of dump are numbered apart. So what each
# compile dumped is kept here, both backward kernels' included, and each kind of file is matched by its order.
_DUMPS: dict[tuple, dict[str, str]] = {}


def _compile_and_read_dumps(fn, arguments, settings: list[tuple]) -> None:
    """Compile fn for its (abstract) arguments with Mosaic GPU's dumps on and keep each of its kernels' dumps in
    _DUMPS under its setting (settings: one per kernel, in compile order)."""
    with tempfile.TemporaryDirectory() as folder:
        names = ("MOSAIC_GPU_DUMP_TO", "MOSAIC_GPU_DUMP_PTX", "MOSAIC_GPU_DUMP_PTXAS", "MOSAIC_GPU_DUMP_RESOURCES")
        saved = {name: os.environ.get(name) for name in names}
        os.environ.update(dict(zip(names, (folder, "1", "1", "1"))))
        try:
            fn.lower(*arguments).compile()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        read = lambda file: open(os.path.join(folder, file)).read()
        # Files are named <module>_<n>.<suffix>: in compile order within each kind.
        stems = lambda suffix: sorted((file[:-len(suffix)] for file in os.listdir(folder) if file.endswith(suffix)),
                                      key=lambda stem: int(stem.split("_")[-1]))
        resources, compiled = stems(".resources.txt"), stems(".ptx")
        fresh = [setting for setting in settings if setting not in _DUMPS]
        # jax 0.11 compiles every kernel again; 0.12 only those this process has not compiled before.
        recompiled = settings if len(compiled) == len(settings) else fresh
        if len(resources) != len(settings) or len(compiled) != len(recompiled):
            raise RuntimeError(f"Mosaic GPU dumped {len(resources)} resource counts and {len(compiled)} PTX files for "
                               f"{len(settings)} kernels, {len(fresh)} of them new here (jax {jax.__version__} compiles "
                               "an identical kernel once per process: was one compiled outside bench.mosaic_gpu_static?)")
        for setting, stem in zip(recompiled, compiled):
            _DUMPS.setdefault(setting, {".ptx": read(stem + ".ptx"), ".ptxas": read(stem + ".ptxas")})
        for setting, stem in zip(settings, resources):
            _DUMPS[setting].setdefault(".resources.txt", read(stem + ".resources.txt"))


def compile_kernel(kernel: str, layer: str, head_dim: int, block: int, num_stages: int, seq: int = 1024,
                   held: int = 64) -> dict:
    """Compile one kernel ("forward", "dq" or "dkv") at one setting for an H100 and return what Mosaic GPU dumped:
    registers, spills, shared memory, PTX. block: the rows the kernel streams at a time; held: the forward's
    block_q (128: two consumer warpgroups and a producer)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from bertjax import gpu_aot
    from bertjax.ops.mosaic_gpu_attention import mosaic_forward
    from bertjax.ops.mosaic_gpu_attention_backward import mosaic_backward

    setting = (kernel, layer, head_dim, block, num_stages, seq, held)
    if setting not in _DUMPS:
        sharding = NamedSharding(Mesh(gpu_aot.gpu_devices("h100"), ("d",)), PartitionSpec())
        array = jax.ShapeDtypeStruct((1, seq, 12, head_dim), jnp.bfloat16, sharding=sharding)
        segments = jax.ShapeDtypeStruct((1, seq), jnp.int32, sharding=sharding)
        lse = jax.ShapeDtypeStruct((1, 12, seq), jnp.float32, sharding=sharding)
        half = None if layer == "global" else 64
        if kernel == "forward":
            fn = jax.jit(lambda q, k, v, s: mosaic_forward(q, k, v, s, scale=0.125, half=half, block_k=block,
                                                           num_stages=num_stages, interpret=False, block_q=held))
            _compile_and_read_dumps(fn, (array, array, array, segments), [setting])
        else:  # both backward kernels compile, dq first; the other one streams 64 rows
            blocks = dict(dq_block=block, dkv_block=64) if kernel == "dq" else dict(dq_block=64, dkv_block=block)
            fn = jax.jit(lambda q, k, v, s, o, l, do: mosaic_backward(q, k, v, s, o, l, do, scale=0.125, half=half,
                                                                      dq_stages=num_stages, dkv_stages=num_stages,
                                                                      interpret=False, **blocks))
            _compile_and_read_dumps(fn, (array, array, array, segments, array, lse, array),
                                    [(name, layer, head_dim, blocks[f"{name}_block"], num_stages, seq, held)
                                     for name in ("dq", "dkv")])
    dumped = _DUMPS[setting]
    log = dumped[".ptxas"]
    found = {key: pattern.search(log) for key, pattern in PTXAS.items()}
    shared = SHARED.search(dumped[".resources.txt"])
    if not all(found.values()) or shared is None:
        raise RuntimeError(f"Mosaic GPU dumped no ptxas report or resource count (jax {jax.__version__}):\n{log}")
    return {**{key: int(match.group(1)) for key, match in found.items()}, "shared": int(shared.group(1)),
            "ptx": dumped[".ptx"]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", nargs="+", choices=["forward", "dq", "dkv"], default=["forward", "dq", "dkv"])
    parser.add_argument("--layers", nargs="+", choices=["global", "local"], default=["global", "local"])
    parser.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--blocks", nargs="+", type=int, default=[64, 128], help="rows streamed at a time")
    parser.add_argument("--stages", nargs="+", type=int, default=[2, 3])
    parser.add_argument("--forward-rows", nargs="+", type=int, default=[64, 128],
                        help="the forward's held rows (block_q): 64 one warpgroup, 128 two and a producer")
    args = parser.parse_args(argv)
    from bertjax.ops.mosaic_gpu_attention import check_supported, shared_memory_bytes

    print(f"# Mosaic GPU kernels (bfloat16, 64 held rows, one warpgroup), jax {jax.__version__}, sm_90a; local: "
          f"window 128; shared memory as Mosaic GPU allocates it (and as bertjax's check counts it)")
    print("| kernel | held | layer | head_dim | streamed | stages | registers | spill stores / loads (B) | "
          "shared memory (B) | blocks / SM | loop: instructions, ex2, fma, selp (masked / unmasked / masked) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    settings = [(kernel, held) for kernel in args.kernels for held in (args.forward_rows if kernel == "forward"
                                                                       else [64])]
    for (kernel, held), layer, head_dim, block, stages in itertools.product(settings, args.layers, args.head_dims,
                                                                            args.blocks, args.stages):
        setting = f"| {kernel} | {held} | {layer} | {head_dim} | {block} | {stages} |"
        try:
            check_supported("mosaic_gpu_static", kernel, dtype=jnp.bfloat16, padded_head_dim=head_dim, alibi=False,
                            held=held, block=block, num_stages=stages)
        except ValueError as error:
            print(f"{setting} refused: {error} |||||")
            continue
        found = compile_kernel(kernel, layer, head_dim, block, stages, held=held)
        counted = shared_memory_bytes(kernel, jnp.bfloat16, head_dim, block, stages, held)
        bodies = loop_bodies(found["ptx"])
        loops = " / ".join(f"{b['all']}, {b['ex2']}, {b['fma']}, {b['selp']}" for b in bodies)
        # The two-warpgroup forward launches 3 warpgroups whose consumers raise their registers to 232 and whose
        # producer lowers its own to 40 (setmaxnreg): the launch's count is ptxas's, the SM holds one program.
        warps = 4 * (held // 64 + 1) if held > 64 else 4
        print(f"{setting} {found['registers']} | {found['spill_stores']} / {found['spill_loads']} | "
              f"{found['shared']:,}{'' if counted == found['shared'] else f' (counted {counted:,})'} | "
              f"{blocks_per_sm(warps, found['registers'], found['shared'])} | {loops} |")


if __name__ == "__main__":
    main()
