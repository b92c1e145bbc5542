"""Where a train step's time goes: a jax.profiler trace of the jitted step `bertjax pretrain` runs, summed by
operation (device kernels on GPU/TPU, XLA fusions on CPU) and by kind (attention kernels, matrix products,
everything else), printed as a short table; then by the model code that made each kernel (the compiled HLO's op
names, layers merged), beside that code's floor from bench/step_floor.py: where measured time is far above the
floor is where the step loses time.

    python -m bench.profile_step                                         # modernbert-base, 16 x 1024, bf16 (GPU)
    python -m bench.profile_step --preset modernbert-tiny --batch 8 --seq 128 --dtype float32   # quick, on CPU
    python -m bench.profile_step --attention xla --trace-dir /tmp/trace  # keep the trace (TensorBoard, Perfetto)

The rows come from bench/train_bench.py's synthetic packed batches (no data pipeline); `--steps` steps are traced
after one compiling step, and times are per step. On a GPU the device rows add up to the kernels' busy time; a
step's wall time above that is launch gaps or host work.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import shutil
import tempfile

import jax
import numpy as np

from bench.step_floor import floor_rates, kernels_of
from bench.train_bench import Case, synthetic_batch
from bertjax.config import get_config
from bertjax.data.global_batch import batch_sharding
from bertjax.train import mesh as mesh_lib
from bertjax.train.setup import setup_run

# Kind of an operation by its name, first match wins (kernel names on GPU, HLO names on CPU and TPU).
KINDS = (
    ("attention kernel", re.compile(r"bertjax_(flash|disentangled)|attention|splash|fmha|cudnn", re.I)),
    ("matrix product", re.compile(r"gemm|matmul|dot|cublas|cutlass|wgmma|xmma|sm90_|ynn_fusion", re.I)),
    ("collective", re.compile(r"all-reduce|all-gather|reduce-scatter|nccl|collective", re.I)),
    ("copy / layout", re.compile(r"copy|transpose|memcpy|memset", re.I)),
)
# Host-side dispatch and bookkeeping (CPU traces hold them beside the XLA operations).
HOST_ONLY = re.compile(r"^(PjitFunction|ThunkExecutor|Thunk|\$|ExecuteHelper|PjRt|TfrtCpu|Execute|Common|Slinky|"
                       r"ParseArguments|CreateOutputs|end: )")


def kind_of(name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(name)), "other (elementwise, reductions)")


def device_events(trace_file: str) -> tuple[list[dict], list[str]]:
    """Complete events of the device streams (processes named /device:...), and those processes' names; on CPU,
    where XLA runs on host threads, every event but the host-side dispatch ones."""
    events = json.load(gzip.open(trace_file))["traceEvents"]
    names = {e["pid"]: e["args"].get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and "args" in e}
    # Accelerators only: not the CPU, nor libtpu's "/device:CUSTOM:Megascale Trace", which it adds on any machine
    # where it is installed.
    devices = {pid for pid, name in names.items()
               if "/device:" in name and "CPU" not in name.upper() and "/device:CUSTOM" not in name}
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if devices:
        return [e for e in complete if e["pid"] in devices], sorted(names[pid] for pid in devices)
    return [e for e in complete if not HOST_ONLY.match(e["name"])], ["host threads (no device process)"]


def summarise(events: list[dict], steps: int, top: int) -> str:
    total = collections.Counter()
    count = collections.Counter()
    for e in events:
        key = re.sub(r"[._]\d+$", "", e["name"])  # fusion.12, fusion_3 -> one row per operation kind
        total[key] += e["dur"]
        count[key] += 1
    busy = sum(total.values())
    lines = [f"{'ms/step':>9} {'share':>6} {'calls':>6}  operation"]
    for key, micros in total.most_common(top):
        lines.append(f"{micros / 1e3 / steps:9.2f} {micros / busy:6.1%} {count[key] // steps:6d}  {key[:100]}")
    kinds = collections.Counter()
    for key, micros in total.items():
        kinds[kind_of(key)] += micros
    lines.append("")
    lines.append(f"{'ms/step':>9} {'share':>6}  kind")
    for kind, micros in kinds.most_common():
        lines.append(f"{micros / 1e3 / steps:9.2f} {micros / busy:6.1%}  {kind}")
    lines.append(f"{busy / 1e3 / steps:9.2f} {1:6.1%}  all operations traced")
    return "\n".join(lines)


def kernel_names(event: dict) -> list[str]:
    """The names of the program's kernel an event may carry, most specific first. A GPU kernel's `hlo_op` is its
    annotation stack, outermost first and joined by "::" where thunks nest (a while loop's body, a conditional):
    the kernel is the innermost op. Without it, the event's name: the HLO instruction's, or the emitted kernel's,
    where the instruction's ".N" became "_N" (PTX names take no dots)."""
    names = []
    if "hlo_op" in event.get("args", {}):
        names.append(event["args"]["hlo_op"].split("::")[-1])
    names.append(event["name"])
    names.append(re.sub(r"_(\d+)$", r".\1", event["name"]))
    return names


def matched_kernel(event: dict, kernel_of: dict):
    """The compiled program's kernel a trace event ran, or None (a cuBLAS or Pallas call, a copy, a memset)."""
    return next((kernel_of[name] for name in kernel_names(event) if name in kernel_of), None)


def by_source(events: list[dict], kernels: list, steps: int, bandwidth: float, matmul_rate: float,
              top: int) -> str:
    """Measured device time per model code (events joined to the compiled program's kernels by their HLO op),
    beside the floor of those kernels (`Kernel.floor`)."""
    kernel_of = {kernel.name: kernel for kernel in kernels}
    measured, floors, unmatched, unmatched_examples = collections.Counter(), {}, 0, []
    for e in events:
        kernel = matched_kernel(e, kernel_of)
        if kernel is None:
            unmatched += e["dur"]
            if len(unmatched_examples) < 3:
                unmatched_examples.append(f"{e['name']} {e.get('args', {})}"[:300])
            continue
        measured[kernel.source] += e["dur"]
    for kernel in kernels:
        low, high = floors.get(kernel.source, (0.0, 0.0))
        kernel_low, kernel_high = kernel.floor(bandwidth, matmul_rate)
        floors[kernel.source] = (low + kernel_low, high + kernel_high)
    lines = [f"{'ms/step':>9} {'floor ms':>13}  model code (kernels of the compiled step)"]
    for source, micros in measured.most_common(top):
        low, high = floors[source]
        lines.append(f"{micros / 1e3 / steps:9.2f} {low * 1e3:6.2f}..{high * 1e3:<5.2f}  {source}")
    lines.append(f"{unmatched / 1e3 / steps:9.2f} {'':>13}  events not matched to a kernel of the step")
    # What the join missed, to fix it from the log alone (a GPU lease is short): the event names and arguments
    # beside a few of the program's kernel names.
    lines += [f"#   unmatched event: {example}" for example in unmatched_examples]
    if unmatched_examples:
        lines.append(f"#   kernels of the program, e.g.: {', '.join(list(kernel_of)[:5])}")
    return "\n".join(lines)


def by_kernel(events: list[dict], kernels: list, steps: int, top: int) -> str:
    """The matched kernels that took longest, each with its calls a step, time and bytes (read and written, at
    most) per call, and the rate those imply: a memory-bound kernel streaming far below the card's bandwidth is
    slow, one near it can only get faster by moving fewer bytes. Identical fusions share one emitted kernel, so a
    kernel's calls are often one per layer."""
    kernel_of = {kernel.name: kernel for kernel in kernels}
    micros, calls = collections.Counter(), collections.Counter()
    for e in events:
        kernel = matched_kernel(e, kernel_of)
        if kernel is not None:
            micros[kernel.name] += e["dur"]
            calls[kernel.name] += 1
    lines = [f"{'ms/step':>9} {'calls':>6} {'us each':>8} {'MB each':>8} {'TB/s':>6}  kernel (model code)"]
    for name, total in micros.most_common(top):
        kernel, each = kernel_of[name], total / calls[name]
        moved = kernel.reads + kernel.writes
        lines.append(f"{total / 1e3 / steps:9.2f} {calls[name] / steps:6.1f} {each:8.1f} {moved / 1e6:8.1f} "
                     f"{moved / each / 1e6:6.2f}  {name} ({kernel.source})")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="modernbert-base")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--attention", default="auto", help="attention implementation (auto: the platform's best)")
    parser.add_argument("--remat", default="none")
    parser.add_argument("--documents-per-row", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3, help="steps traced, after one compiling step")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--trace-dir", default=None, help="keep the trace here (default: a temporary directory)")
    parser.add_argument("--copy-to", default=None,
                        help="also write the trace (profile.trace.json.gz) and the step's optimized HLO "
                        "(profile.hlo.txt.gz) into this directory, for the join to be redone elsewhere")
    parser.add_argument("--bandwidth", type=float, default=None,
                        help="floors: bytes/s read plus written (default: this device's, bench.step_floor.CEILINGS)")
    parser.add_argument("--matmul-rate", type=float, default=None,
                        help="floors: FLOP/s of the products (default: this device's bf16, bench.step_floor.CEILINGS)")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    config = get_config(args.preset, dtype=args.dtype, attention_implementation=args.attention,
                        max_position_embeddings=max(args.seq, get_config(args.preset).max_position_embeddings))
    case = Case(args.preset, config, batch=args.batch, seq_len=args.seq, documents_per_row=args.documents_per_row,
                remat_policy=args.remat)
    setup = setup_run(case.run_config(args.steps + 1), vocab_size=config.vocab_size, pad_id=config.pad_token_id)
    state = setup.fresh_state()
    batch = {k: jax.device_put(v, batch_sharding(setup.mesh, mesh_lib.BATCH_AXES))
             for k, v in synthetic_batch(case).items()}
    state, metrics = setup.train_step(state, setup.frozen, batch)  # compile
    jax.block_until_ready(metrics)
    trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="bertjax-trace-")
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(args.steps):
            state, metrics = setup.train_step(state, setup.frozen, batch)
        jax.block_until_ready(metrics)
    files = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))
    if not files:
        raise SystemExit(f"no trace written under {trace_dir}")
    device = jax.devices()[0]
    print(f"# {args.preset} {args.batch}x{args.seq} {args.dtype}, attention {args.attention}, remat {args.remat}, "
          f"on {device.device_kind} (jax {jax.__version__}); trace {files[-1]}")
    events, sources = device_events(files[-1])
    print(f"# events of: {', '.join(sources)}")
    print(summarise(events, args.steps, args.top))
    # The program just traced, compiled again for its HLO (the persistent compilation cache, when on, returns it).
    text = setup.train_step.lower(state, setup.frozen, batch).compile().as_text()
    if args.copy_to:
        os.makedirs(args.copy_to, exist_ok=True)
        shutil.copyfile(files[-1], os.path.join(args.copy_to, "profile.trace.json.gz"))
        with gzip.open(os.path.join(args.copy_to, "profile.hlo.txt.gz"), "wt") as f:
            f.write(text)
    step_events = [e for e in events if e.get("args", {}).get("hlo_module", "jit_train_step") == "jit_train_step"]
    print()
    kernels = kernels_of(text)
    bandwidth, matmul_rate, rates = floor_rates(device.device_kind, args.bandwidth, args.matmul_rate)
    print(rates)
    print(by_source(step_events, kernels, args.steps, bandwidth, matmul_rate, args.top))
    print()
    print(by_kernel(step_events, kernels, args.steps, args.top))
    print(f"loss {float(np.asarray(metrics['loss'])):.3f}")


if __name__ == "__main__":
    main()
