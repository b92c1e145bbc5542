"""Time and memory of every attention implementation on this backend, against the dense XLA reference, same run.

    python -m bench.attention_bench [--seqs 512 2048 8192] [--window 128] [--heads 12] [--head-dim 64]
                                    [--batch 1] [--dtype float32|bfloat16] [--max-gib 4] [--packed-docs 16]
    python -m bench.attention_bench --tune --seqs 8192 [--tune-passes forward dq dkv atomic]  # GPU: kernels' tiles

For each sequence length, both layer kinds of ModernBERT (global, and local with the window), a global layer over
a row packed with --packed-docs equal documents (segment ids; block skipping should make it cheaper than one
document of the same length), and both passes (forward; forward + backward through `jax.vjp`) are compiled and
timed. `--tune` times each of `pallas_gpu`'s kernels (forward, dq, dk/dv; `--tune-passes`) at every combination
of TUNING's tiles, warps and pipeline stages instead, on the global and local layers, and prints the fastest of each
as keyword arguments of `pallas_gpu_attention` (the library's defaults are in bertjax/ops/pallas_gpu_attention.py),
then the backward with the fastest dq and dk/dv together (`atomic`: the one-pass backward's tiles, and
forward + backward with the fastest against cuDNN); off a GPU it runs the kernels in interpret mode, to check
the sweep, not to time it. Memory is the compiled program's
temporary buffer size (`memory_analysis().temp_size_in_bytes`: what the attention itself needs beyond inputs and
outputs); on GPU the device's peak bytes in use are printed as well, where the row raised the process's peak (JAX
cannot reset it), else as the running maximum it stayed under. A program whose temporaries exceed --max-gib
is compiled (to report its size) but not run. Ratios are relative to the dense `xla` reference of the same row:
speed-up = reference time / time, memory = temp / reference temp. Every timed row is also checked: the max abs
error of its outputs (and gradients) against dense XLA's on the same inputs, or cuDNN's where XLA's scores exceed
--max-gib, or the blockwise XLA path's where neither expresses the row (CHECK_REFERENCES).

Implementations per backend: CPU runs the XLA paths; GPU adds `pallas_gpu` and cuDNN global attention
(`jax.nn.dot_product_attention(implementation="cudnn")`, which has no bidirectional window and no packing, so it
is timed on global layers only, without segment ids); TPU adds `pallas_tpu`. Pallas in interpret mode is a
correctness tool, not timed.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import math
import os
import platform
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from bertjax import ops

IMPLEMENTATIONS_BY_BACKEND = {
    "cpu": ["xla", "xla_blockwise", "xla_auto"],
    "gpu": ["xla", "xla_blockwise", "pallas_gpu", "pallas_gpu_atomic", "pallas_gpu_mosaic", "cudnn"],
    "tpu": ["xla", "xla_blockwise", "pallas_tpu"],
}
REFERENCE = "xla"
# JAX's own Hopper FlashAttention (jax.experimental.pallas.ops.gpu.attention_mgpu: Pallas Mosaic GPU, TMA copies,
# wgmma, warp-specialised), timed beside pallas_gpu and cuDNN as the mark a Mosaic GPU port of bertjax's kernels
# would start from. It has no segments, window or scale (q is scaled first), and its forward keeps float16 shared
# memory whatever its inputs' type (jax 0.11.2: bfloat16 fails to lower), so it runs on float16 inputs: the same
# tensor-core rate as bfloat16 on Hopper.
MOSAIC_GPU = "mosaic_gpu_f16"
INPUT_DTYPES = {MOSAIC_GPU: jnp.float16}
# --tune: each pallas_gpu kernel's parameters tried (every combination, the library's defaults first), by pass:
# the forward's, the dq kernel's (backward_*) and the dk/dv kernel's (dkv_*). block_q counts query rows and block_k
# key rows in all three; a dq program holds block_q queries and a dk/dv program block_k keys, so each backward
# kernel's sweep holds 64 or 128 rows and streams the others 32 to 128 at a time.
TUNING = {
    "forward": {"block_q": (64, 128), "block_k": (32, 64, 128), "num_warps": (4, 8), "num_stages": (2, 3)},
    "dq": {"backward_block_q": (64, 128), "backward_block_k": (32, 64, 128), "backward_num_warps": (4, 8),
           "backward_num_stages": (2, 3)},
    "dkv": {"dkv_block_k": (64, 128), "dkv_block_q": (32, 64, 128), "dkv_num_warps": (4, 8),
            "dkv_num_stages": (2, 3)},
    # the one-pass backward (backward_kernel="triton_atomic", pallas_gpu_attention_one_pass.py) on the dk/dv
    # kernel's tiles, which it takes
    "atomic": {"dkv_block_k": (64, 128), "dkv_block_q": (32, 64, 128), "dkv_num_warps": (4, 8),
               "dkv_num_stages": (2, 3)},
}
TUNE_PREFIX = {"forward": "", "dq": "backward_", "dkv": "dkv_", "atomic": "dkv_"}
# Options every setting of a --tune pass carries besides its grid's.
PASS_OPTIONS = {"atomic": {"backward_kernel": "triton_atomic"}}
# --tune --tune-kernels mosaic: the Mosaic GPU kernels' own parameters (pallas_gpu_mosaic): the streamed rows and the
# ring's depth, and for the forward one warpgroup holding 64 queries or two holding 128 with a producer; the backward
# kernels hold 64 rows (one warpgroup).
MOSAIC_TUNING = {
    "forward": {"block_q": (64, 128), "block_k": (64, 128), "num_stages": (2, 3, 4)},
    "dq": {"backward_block_k": (64, 128), "backward_num_stages": (2, 3, 4)},
    "dkv": {"dkv_block_q": (64, 128), "dkv_num_stages": (2, 3, 4)},
}
# The rows each kernel's program holds. Triton runs a Hopper tile product per warpgroup (4 warps) on 64 rows, so more
# warpgroups than a tile's rows fill compute its scores once per warpgroup: at 64 rows with 8 warps the compiled
# loops exponentiate every score twice (bench.pallas_gpu_static), and the second lease's sweep at 8192 measured the
# forward at 1.6-2.2x the time of the same tiles on 4 warps (docs/benchmarks.md). The sweep leaves them out.
HELD_ROWS = {"forward": "block_q", "dq": "backward_block_q", "dkv": "dkv_block_k", "atomic": "dkv_block_k"}
KERNEL_SETTINGS = ("block_q", "block_k", "num_warps", "num_stages")


def attention_fn(name: str, window: int | None, scale: float, packed: bool = False) -> Callable | None:
    """fn(q, k, v, segment_ids) -> out for one implementation, or None when it cannot express this layer."""
    if name == "cudnn":
        if window is not None or packed:
            return None  # cuDNN rejects a bidirectional window; packed segments are not expressed here

        def cudnn(q, k, v, segment_ids):
            del segment_ids  # one unpadded sequence per row in this benchmark
            return jax.nn.dot_product_attention(q, k, v, scale=scale, implementation="cudnn")

        return cudnn
    if name == MOSAIC_GPU:
        if window is not None or packed:
            return None
        from jax.experimental.pallas.ops.gpu import attention_mgpu

        # Forward tiles as attention_mgpu's own benchmark prefers them (2 x 64 query rows per CTA, 128 keys a
        # step); 64-row tiles throughout the backward.
        config = attention_mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, block_q_dkv=64,
                                             block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)

        def mosaic_gpu(q, k, v, segment_ids):
            del segment_ids  # one unpadded sequence per row in this benchmark
            return attention_mgpu.attention((q * scale).astype(q.dtype), k, v, config)

        return mosaic_gpu
    return lambda q, k, v, segment_ids: ops.attention(q, k, v, segment_ids=segment_ids, local_window=window,
                                                      implementation=name, scale=scale)


def forward_backward(fn):
    def run(q, k, v, segment_ids, cotangent):
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, segment_ids), q, k, v)
        return out, vjp(cotangent)

    return run


def median_seconds(fn, args, repeats: int, min_seconds: float, sample_seconds: float = 2e-3) -> float:
    """Median seconds per call. A sample is several calls queued back to back, then one wait: each call's host
    dispatch overlaps the previous call on the device, so a sample of a short kernel times the device rather than
    the host's launch path; calls per sample are chosen to make a sample last about `sample_seconds`."""
    jax.block_until_ready(fn(*args))  # warm-up
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    calls = int(min(100, max(1, sample_seconds // max(time.perf_counter() - t0, 1e-6))))
    times = []
    start = time.perf_counter()
    while len(times) < repeats or (time.perf_counter() - start < min_seconds and len(times) < 50):
        t0 = time.perf_counter()
        for _ in range(calls - 1):
            fn(*args)
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) / calls)
    return float(np.median(times))


def packed_segment_ids(batch: int, seq: int, documents: int) -> jax.Array:
    """Rows of `documents` equal documents (the last takes the remainder); 1 gives one document per row."""
    return jnp.tile(jnp.minimum(jnp.arange(seq) // (seq // documents), documents - 1) + 1, (batch, 1)).astype(
        jnp.int32)


def first_line(error: Exception) -> str:
    return f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:80]}"


# The implementations whose outputs every timed row is checked against, in order of preference: dense XLA where its
# scores fit --max-gib, else cuDNN (global layers of one document), else XLA's blockwise path (any layer).
CHECK_REFERENCES = ("xla", "cudnn", "xla_blockwise")


def inputs(name, shapes, dtype, documents: int) -> tuple:
    """(q, k, v, cotangent, segment_ids) of a row: the same draws for every implementation of one input dtype."""
    batch, seq, heads, head_dim = shapes
    keys = jax.random.split(jax.random.key(seq), 4)
    dtype = INPUT_DTYPES.get(name, dtype)
    q, k, v, ct = (jax.random.normal(key, (batch, seq, heads, head_dim), dtype) for key in keys)
    return q, k, v, ct, packed_segment_ids(batch, seq, documents)


def compiled_program(fn, passes, q, k, v, ct, segment_ids):
    """(compiled program, its arguments); raises where the implementation does not compile here."""
    if passes == "forward":
        program, args = jax.jit(fn), (q, k, v, segment_ids)
    else:
        program, args = jax.jit(forward_backward(fn)), (q, k, v, segment_ids, ct)
    return program.lower(*args).compile(), args


def temp_bytes(compiled) -> int | None:
    stats = compiled.memory_analysis()
    return stats.temp_size_in_bytes if stats is not None else None


def reference_key(window, passes, shapes, dtype, documents: int) -> tuple:
    return window, passes, shapes, jnp.dtype(dtype).name, documents


def reference_outputs(cache: dict, window, passes, shapes, dtype, documents: int, max_bytes) -> tuple | None:
    """(name, outputs) of this row's reference on its own inputs: the first CHECK_REFERENCES implementation timed
    on it (`measure` keeps its outputs), else the first that expresses the row, compiles and fits `max_bytes`,
    computed here once; None where none does."""
    key = reference_key(window, passes, shapes, dtype, documents)
    if key not in cache:
        cache[key] = None
        q, k, v, ct, segment_ids = inputs(None, shapes, dtype, documents)
        for name in CHECK_REFERENCES:
            fn = attention_fn(name, window, 1 / math.sqrt(shapes[3]), packed=documents > 1)
            if fn is None or (name == "cudnn" and jax.default_backend() != "gpu"):
                continue
            try:
                compiled, args = compiled_program(fn, passes, q, k, v, ct, segment_ids)
                temp = temp_bytes(compiled)
                if temp is not None and temp > max_bytes:
                    continue
                cache[key] = (name, jax.block_until_ready(compiled(*args)))
                break
            except Exception:  # noqa: BLE001: the next reference, or a row without a check
                continue
    return cache[key]


def max_abs_error(outputs, reference) -> float:
    """The largest absolute difference over every output (forward: the attention; forward+backward: it and dq, dk,
    dv), in float32; NaN where either holds one."""
    pairs = zip(jax.tree_util.tree_leaves(outputs), jax.tree_util.tree_leaves(reference))
    return max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))) for a, b in pairs)


def measure(name, window, passes, shapes, dtype, repeats, min_seconds, max_bytes, documents: int = 1,
            fn=None, references: dict | None = None) -> dict:
    """A row's time and memory; with `references` (a cache shared by the implementations timed on one row), also its
    outputs' max abs error against a reference implementation's on the same inputs (`reference_outputs`), so a
    timed row is a checked one."""
    fn = fn or attention_fn(name, window, 1 / math.sqrt(shapes[3]), packed=documents > 1)
    if fn is None:
        return {"status": "n/a"}
    q, k, v, ct, segment_ids = inputs(name, shapes, dtype, documents)
    try:
        compiled, args = compiled_program(fn, passes, q, k, v, ct, segment_ids)
    except Exception as error:  # e.g. cuDNN unavailable for this shape or GPU generation
        return {"status": f"failed: {first_line(error)}"}
    temp = temp_bytes(compiled)
    if temp is not None and temp > max_bytes:
        return {"status": "skipped", "temp": temp}
    # JAX keeps one peak for the process and cannot reset it: a row owns the peak only if it raised it.
    peak_before = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    try:
        seconds = median_seconds(compiled, args, repeats, min_seconds)
        result = {"status": "ok", "seconds": seconds, "temp": temp}
        peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")  # before a reference's compile
        key = reference_key(window, passes, shapes, q.dtype, documents)
        if references is not None and name in CHECK_REFERENCES and references.get(key) is None:
            references[key] = (name, jax.block_until_ready(compiled(*args)))  # the row's reference: no compile
            result["checked_against"] = "is the reference"
        elif references is not None:
            reference = reference_outputs(references, window, passes, shapes, q.dtype, documents, max_bytes)
            if reference is not None:
                result["checked_against"] = reference[0]
                result["max_abs_error"] = max_abs_error(compiled(*args), reference[1])
    except Exception as error:  # noqa: BLE001 (a kernel failing on the device: its row says so, others run)
        return {"status": f"failed while running: {first_line(error)}"}
    if peak is not None:
        result["device_peak"] = peak
        result["peak_raised"] = peak_before is None or peak > peak_before
    return result


def machine_description() -> str:
    device = jax.devices()[0]
    memory = ""
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        memory = f", {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB RAM"
    return (f"{jax.default_backend()} ({device.device_kind}), {os.cpu_count()} CPU cores{memory}, "
            f"{platform.processor() or platform.machine()}; jax {jax.__version__}")


def gib(value) -> str:
    return "-" if value is None else f"{value / 2**30:.3f}"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="default: float32 on CPU, bfloat16 on GPU/TPU")
    parser.add_argument("--implementations", nargs="+", default=None,
                        help=f"default per backend: {IMPLEMENTATIONS_BY_BACKEND}")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--max-gib", type=float, default=4.0, help="do not run programs needing more temp memory")
    parser.add_argument("--packed-docs", type=int, default=16,
                        help="documents per row of the packed global layer (0: leave that layer out)")
    parser.add_argument("--passes", nargs="+", choices=["forward", "forward+backward"],
                        default=["forward", "forward+backward"], help="the passes timed (not --tune)")
    parser.add_argument("--tune", action="store_true", help="GPU: sweep pallas_gpu's kernel parameters")
    parser.add_argument("--tune-layers", nargs="+", choices=["global", "local"], default=["global", "local"],
                        help="--tune: the layers to sweep, in this order")
    parser.add_argument("--tune-passes", nargs="+", choices=list(TUNING), default=["forward", "dq", "dkv"],
                        help="--tune: the kernels to sweep, in this order (atomic: the one-pass backward, "
                             "backward_kernel='triton_atomic')")
    parser.add_argument("--tune-kernels", choices=["triton", "mosaic"], default="triton",
                        help="--tune: pallas_gpu's Triton kernels (TUNING) or its Mosaic GPU ones (MOSAIC_TUNING)")
    parser.add_argument("--tune-docs", type=int, default=1,
                        help="--tune: documents packed per row (bench.train_bench --gpu packs 4 per row of 1024)")
    args = parser.parse_args(argv)
    if args.tune_kernels == "mosaic" and not set(args.tune_passes) <= set(MOSAIC_TUNING):
        parser.error(f"--tune-kernels mosaic sweeps {list(MOSAIC_TUNING)}, not {args.tune_passes}")
    if min(args.seqs + [args.window, args.heads, args.head_dim, args.batch, args.repeats, args.tune_docs]) <= 0:
        parser.error("--seqs, --window, --heads, --head-dim, --batch, --repeats and --tune-docs must be positive")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    backend = jax.default_backend()
    names = args.implementations or IMPLEMENTATIONS_BY_BACKEND.get(backend, ["xla", "xla_blockwise"])
    if REFERENCE not in names:
        names = [REFERENCE, *names]
    # The references first at each row: their own timed outputs check the others' at no extra compile.
    names = [name for name in CHECK_REFERENCES if name in names] + [n for n in names if n not in CHECK_REFERENCES]
    dtype = jnp.dtype(args.dtype or ("float32" if backend == "cpu" else "bfloat16"))
    print(f"# attention_bench  {datetime.date.today()}  {machine_description()}")
    if args.tune:
        return tune(args, dtype)
    print(f"# batch {args.batch}, heads {args.heads}, head_dim {args.head_dim}, {dtype.name}; local window "
          f"{args.window}; memory = compiled temp buffers (GiB); programs over {args.max_gib} GiB are not run\n")
    print("| seq | layer | pass | implementation | time (ms) | speed-up vs xla | temp (GiB) | memory vs xla "
          "| max abs error (vs) |")
    print("|---:|---|---|---|---:|---:|---:|---:|---|")
    results = {}
    layers = [(None, 1), (args.window, 1)] + ([(None, args.packed_docs)] if args.packed_docs > 1 else [])
    try:
        for seq in args.seqs:
            for window, documents in layers:
                for passes in args.passes:
                    reference, references = None, {}  # a row's reference outputs live while its row is measured
                    for name in names:
                        r = measure(name, window, passes, (args.batch, seq, args.heads, args.head_dim), dtype,
                                    args.repeats, args.min_seconds, args.max_gib * 2**30, documents,
                                    references=references)
                        results[(seq, window, documents, passes, name)] = r
                        if name == REFERENCE:
                            reference = r
                        print(row(seq, window, passes, name, r, reference, documents), flush=True)
    except KeyboardInterrupt:  # a time cap (launch/gpu_session.sh): the targets of what was measured still count
        print("# interrupted: targets below are of the rows above")
    if backend == "gpu":
        print_gpu_targets(results, args)


def tune(args, dtype) -> None:
    """Each --tune-passes kernel at every TUNING combination, for each --seqs length and each --tune-layers layer
    (rows of --batch x --tune-docs packed documents). The forward is timed alone. A backward kernel is timed as
    forward + backward, less the default forward's time, with the other backward kernel pinned to the library's
    defaults, so the differences between its rows are its own. The fastest of each group is printed as soon as the
    group is done, as the keyword arguments to give `pallas_gpu_attention`; after both backward sweeps, the backward
    with the fastest of each, against the defaults'."""
    from bertjax.ops.pallas_gpu_attention import (DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K, default_launch,
                                                  pallas_gpu_attention)

    interpret = jax.default_backend() != "gpu"
    if interpret:
        print("# no GPU: the kernels run in interpret mode; these times check the sweep, they are not kernel speeds")
    mosaic = args.tune_kernels == "mosaic"
    grid = MOSAIC_TUNING if mosaic else TUNING
    # The backward kernels hold 64 rows whatever the forward's block_q (which their tiles would otherwise inherit).
    kernels = dict(forward_kernel="mosaic", backward_kernel="mosaic", backward_block_q=64,
                   dkv_block_k=64) if mosaic else {}
    print(f"# batch {args.batch}, {args.tune_docs} document(s) per row, heads {args.heads}, head_dim {args.head_dim}, "
          f"{jnp.dtype(dtype).name}, {args.tune_kernels} kernels")
    print("| seq | layer | pass | block_q | block_k | num_warps | num_stages | time (ms) |")
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    shape_of = lambda seq: (args.batch, seq, args.heads, args.head_dim)
    defaults = dict(zip(KERNEL_SETTINGS, (DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K,
                                          *default_launch(max(16, 1 << (args.head_dim - 1).bit_length())))))
    if mosaic:  # one warpgroup whatever the head_dim: warps left to the kernels
        defaults["num_warps"] = None
    pinned = {"dq": {"dkv_" + name: value for name, value in defaults.items()}, "dkv": {}, "forward": {},
              "atomic": {}}

    def timed(seq, window, passes, options):
        def fn(q, k, v, segment_ids):
            return pallas_gpu_attention(q, k, v, segment_ids=segment_ids, local_window=window,
                                        scale=1 / math.sqrt(args.head_dim), interpret=interpret,
                                        **{**kernels, **options})

        r = measure("pallas_gpu", window, passes, shape_of(seq), dtype, args.repeats, args.min_seconds,
                    args.max_gib * 2**30, documents=args.tune_docs, fn=fn)
        return r["seconds"] if r["status"] == "ok" else r["status"]

    def candidates(kernel):
        """[(options, whether they are the library's defaults)], the defaults first, without the settings that
        give a warpgroup no rows of its own (HELD_ROWS)."""
        names = list(grid[kernel])
        default = tuple(defaults[name.removeprefix(TUNE_PREFIX[kernel])] for name in names)
        every = sorted(itertools.product(*grid[kernel].values()), key=lambda values: values != default)
        options = [{**dict(zip(names, values)), **PASS_OPTIONS.get(kernel, {})} for values in every]
        warps, held = TUNE_PREFIX[kernel] + "num_warps", HELD_ROWS[kernel]
        return [(o, values == default) for o, values in zip(options, every)  # no warpgroup without rows of its own
                if o.get(warps, 4) <= 4 or o[held] >= 16 * o[warps]]  # the Mosaic grid has no warps to choose

    cudnn = {}  # (seq, window) -> cuDNN's forward + backward seconds, or why there are none

    def summarize(seq, window, layer, default_forward, best):
        """Once both backward kernels are swept: the backward with the fastest of each against the defaults'
        (once); and forward + backward with every kernel's fastest so far against cuDNN's on a GPU (global layers
        of one document: cuDNN has no window or segments here), the issue's >= 0.7x."""
        backward = {**best["dq"][1], **best["dkv"][1]}
        options = {**best["forward"][1], **backward} if "forward" in best else backward
        if "backward" not in best:
            seconds = best["backward"] = timed(seq, window, "forward+backward", backward)
            if isinstance(seconds, float) and isinstance(default_forward, float):
                against = f" (the defaults' {best['default'] * 1e3:.3f} ms)" if "default" in best else ""
                print(f"# backward with the fastest dq and dk/dv at seq {seq}, {layer}: "
                      f"{(seconds - default_forward) * 1e3:.3f} ms{against} with {backward}", flush=True)
        against_cudnn(seq, window, layer, options,
                      None if "forward" in best else best["backward"])

    def against_cudnn(seq, window, layer, options, seconds=None):
        """Forward + backward with `options` (timed here unless `seconds` is given) against cuDNN's at the same
        shape, on a GPU, for global layers of one document (cuDNN has no window or segments here): the issue's
        >= 0.7x."""
        if interpret or window is not None or args.tune_docs != 1:
            return
        if (seq, window) not in cudnn:
            r = measure("cudnn", None, "forward+backward", shape_of(seq), dtype, args.repeats, args.min_seconds,
                        args.max_gib * 2**30)
            cudnn[seq, window] = r["seconds"] if r["status"] == "ok" else r["status"]
        if seconds is None:
            seconds = timed(seq, window, "forward+backward", options)
        if isinstance(seconds, float) and isinstance(cudnn[seq, window], float):
            print(f"# forward+backward at seq {seq}, {layer}, with {options}: {seconds * 1e3:.3f} ms, cuDNN's "
                  f"{cudnn[seq, window] * 1e3:.3f} ms: {cudnn[seq, window] / seconds:.2f}x cuDNN's speed (target "
                  f">= 0.7x)", flush=True)
        else:
            print(f"# forward+backward against cuDNN at seq {seq}: pallas_gpu {seconds}, cuDNN {cudnn[seq, window]}",
                  flush=True)

    try:
        windows = [None if layer == "global" else args.window for layer in args.tune_layers]
        for seq, window in itertools.product(args.seqs, windows):
            layer = "global" if window is None else f"local {window}"
            default_forward = timed(seq, window, "forward", {})
            # kernel -> (seconds, options), its fastest; "default": the defaults' backward; "backward": the
            # forward (default) + backward with the fastest dq and dk/dv
            best = {}
            for kernel in args.tune_passes:
                fastest = None
                for options, is_default in candidates(kernel):
                    if kernel == "forward":
                        seconds = timed(seq, window, "forward", options)
                    else:
                        seconds = timed(seq, window, "forward+backward", {**options, **pinned[kernel]})
                        if isinstance(seconds, float):
                            seconds = (seconds - default_forward if isinstance(default_forward, float)
                                       else "failed: no default forward to subtract")
                    shown = f"{seconds * 1e3:.3f}" if isinstance(seconds, float) else seconds
                    values = [options.get(TUNE_PREFIX[kernel] + name, "") for name in KERNEL_SETTINGS]
                    print(f"| {seq} | {layer} | {kernel} | {' | '.join(map(str, values))} | {shown} |", flush=True)
                    if isinstance(seconds, float):
                        if fastest is None or seconds < fastest[0]:
                            fastest = (seconds, options)
                        if kernel in ("dq", "dkv") and is_default:  # the library's defaults, both backward kernels
                            best["default"] = seconds
                if fastest is not None:
                    print(f"# fastest {kernel} at seq {seq}, {layer}: {fastest[0] * 1e3:.3f} ms with {fastest[1]}",
                          flush=True)
                    best[kernel] = fastest
                    if kernel == "atomic":  # a whole backward on its own: forward + backward against cuDNN
                        against_cudnn(seq, window, layer, {**best.get("forward", (None, {}))[1], **fastest[1]})
                if {"dq", "dkv"} <= best.keys():
                    summarize(seq, window, layer, default_forward, best)
    except KeyboardInterrupt:  # launch/gpu_session.sh's time cap: the groups above are complete
        print("# interrupted", flush=True)


def row(seq, window, passes, name, r, reference, documents: int = 1) -> str:
    layer = "global" if window is None else f"local {window}"
    if documents > 1:
        layer += f", {documents} docs"
    if r["status"] != "ok":
        status = r["status"] if r["status"] != "skipped" else f"not run: temp {gib(r['temp'])} GiB over limit"
        return f"| {seq} | {layer} | {passes} | {name} | {status} | | {gib(r.get('temp'))} | | |"
    speedup = memory = ""
    if reference is not None and reference["status"] == "ok":
        speedup = f"{reference['seconds'] / r['seconds']:.2f}x"
    if reference is not None and reference.get("temp") and r.get("temp") is not None:
        memory = f"{r['temp'] / reference['temp']:.3f}"  # known even when the reference was too big to run
    peak = ""
    if "device_peak" in r:  # the process's running maximum: this row's own peak only where it raised it
        peak = (f" (device peak {gib(r['device_peak'])})" if r.get("peak_raised")
                else f" (device peak <= {gib(r['device_peak'])}, running max)")
    error = (f"{r['max_abs_error']:.2e} ({r['checked_against']})" if "max_abs_error" in r
             else r.get("checked_against", "-"))
    return (f"| {seq} | {layer} | {passes} | {name} | {r['seconds'] * 1e3:.2f} | {speedup} | {gib(r['temp'])}{peak} "
            f"| {memory} | {error} |")


def gpu_targets(results, window: int, packed_docs: int) -> list[str]:
    """The issue's attention targets, one line per measured case: pallas_gpu global against cuDNN at every length
    and pass (>= 0.7x), local against global at 8192 (>= 5x; other lengths shown without one), and a row of packed
    documents against one document of the same length (> 1x)."""
    lines = []

    def check(text: str, ratio: float, target: float | None, strict: bool = False) -> None:
        if target is None:
            lines.append(f"# {text}: {ratio:.2f}x (no target at this length)")
            return
        met = ratio > target if strict else ratio >= target
        lines.append(f"# {text}: {ratio:.2f}x (target {'>' if strict else '>='} {target:g}x): "
                     f"{'met' if met else 'NOT met'}")

    def seconds(seq, layer_window, documents, passes, name):
        r = results.get((seq, layer_window, documents, passes, name), {})
        return r["seconds"] if r.get("status") == "ok" else None

    for seq in sorted({key[0] for key in results}):
        for passes in ("forward", "forward+backward"):
            glob = seconds(seq, None, 1, passes, "pallas_gpu")
            if glob is None:
                continue
            cudnn = seconds(seq, None, 1, passes, "cudnn")
            local = seconds(seq, window, 1, passes, "pallas_gpu")
            packed = seconds(seq, None, packed_docs, passes, "pallas_gpu")
            if cudnn is not None:
                check(f"seq {seq} {passes}: pallas_gpu global vs cuDNN's speed", cudnn / glob, 0.7)
            if local is not None:
                check(f"seq {seq} {passes}: pallas_gpu local {window} faster than its global", glob / local,
                      5 if seq == 8192 else None)
            if packed is not None:
                check(f"seq {seq} {passes}: {packed_docs} packed documents faster than one", glob / packed, 1,
                      strict=True)
            for layer_window, layer in ((None, "global"), (window, f"local {window}")):
                for variant in ("pallas_gpu_atomic", "pallas_gpu_mosaic"):  # other kernels: no targets of their own
                    ours, triton = (seconds(seq, layer_window, 1, passes, name) for name in (variant, "pallas_gpu"))
                    if ours is None or triton is None:
                        continue
                    against = f", {cudnn / ours:.2f}x cuDNN's" if cudnn is not None and layer_window is None else ""
                    lines.append(f"# seq {seq} {passes} {layer}: {variant} runs {triton / ours:.2f}x "
                                 f"pallas_gpu's speed{against}")
            mosaic = seconds(seq, None, 1, passes, MOSAIC_GPU)
            if mosaic is not None:  # a mark for a Mosaic GPU port, not a target
                against = f", {cudnn / mosaic:.2f}x cuDNN's" if cudnn is not None else ""
                lines.append(f"# seq {seq} {passes}: {MOSAIC_GPU} (JAX's Hopper kernel, no masks) runs "
                             f"{glob / mosaic:.2f}x pallas_gpu's speed{against}")
    return lines


def print_gpu_targets(results, args) -> None:
    print("\n# targets (pallas_gpu, bf16 unless --dtype said otherwise)")
    print("\n".join(gpu_targets(results, args.window, args.packed_docs)) or "# no pallas_gpu rows measured")

if __name__ == "__main__":
    main()
