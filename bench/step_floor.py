"""The two numbers of a compiled train step (device time floors), read from its optimized HLO: the FLOPs of its
matrix products, and the bytes its other kernels move, per kernel of the program's entry computation.

    python -m bench.step_floor --topology h100                      # modernbert-base, 32 x 1024, for an H100
    python -m bench.step_floor --topology h100 --batch 4 --seq 8192
    python -m bench.step_floor --topology h100 --norm pallas_gpu    # the residual add + norm kernel in every norm
    python -m bench.step_floor --topology h100 --fused-qkv          # attention on the stacked q/k/v projection
    python -m bench.step_floor --topology h100 --glu pallas_gpu     # the gated MLP's act(a) * b kernel
    python -m bench.step_floor --topology h100 --attention pallas_gpu_mosaic  # attention in Mosaic GPU kernels
    python -m bench.step_floor                                      # this machine's backend (a GPU host, or CPU)

`--topology` compiles without the GPU (bertjax/gpu_aot.py; needs JAX's CUDA plugin); without it the step is compiled
for this machine's first device. Each kernel's bytes are counted from the shapes of its operands and outputs, so
they are a range: a kernel writes its outputs at least once, and reads at most its operands; an operand a fusion
only slices (through bitcasts), as RoPE and the split of q, k and v slice the fused projection's output, counts as
the slices it reads, and a fusion that updates a slice of an operand in place (a dynamic-update-slice root) writes
that slice and reads nothing else of the operand. Products' FLOPs are 2 x output elements x contracted size of every
dot in a fusion; the Pallas kernels are listed by their bytes (attention's FLOPs depend on the segments; the norm
and GLU kernels' bytes count every row they read and write, as the other kernels').
Times are at --bandwidth and --matmul-rate (defaults: what the device tool measured on the target card, CEILINGS:
an H100's 3.0 TB/s counting bytes read plus written and 798 TFLOP/s bf16, an H200's 4.3 TB/s and 790 TFLOP/s), and
the largest memory-bound kernels are grouped by the model code that made them (the HLO's op names, layers merged).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4,
               "f64": 8, "s64": 8, "u64": 8}
_ARRAY = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([\d,]*)\]")
_COMPUTATION = re.compile(r"^(ENTRY )?%(\S+) \(.*\) -> .* \{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*?) ([a-z][\w-]*)\((.*)$")
# Pallas kernels other than attention, by how their names begin (bertjax/ops/pallas_gpu_norm.py, pallas_gpu_glu.py).
PALLAS_KINDS = {"bertjax_add_norm": "norm", "bertjax_glu": "GLU"}
# Custom-call targets of Pallas kernels: Triton (GPU), Mosaic GPU (attention's pallas_gpu_mosaic), Mosaic (TPU).
PALLAS_TARGETS = ("xla.gpu.triton", 'custom_call_target="mosaic_gpu', "tpu_custom_call")
KERNEL_OPS = ("fusion", "custom-call", "copy", "dot", "convolution", "all-reduce", "all-gather", "reduce-scatter",
              "sort", "scatter", "gather", "reduce", "transpose", "concatenate", "dynamic-update-slice")


# The ceilings floors are timed at, by device kind (first matching substring wins): (bytes/s read plus written,
# FLOP/s of bf16 products, where they come from). Measured on the device tool's cards, as METHOD.md asks: a large
# device-to-device copy and an 8192^3 bf16 product on random data, not the datasheets (the H200's 4.8 TB/s HBM3e and
# both cards' 989 TFLOP/s dense bf16 are not reached by either).
CEILINGS = {
    "H200": (4.3e12, 7.9e14, "the device tool's H200 as measured there (its machine notes, 2026-10-28 and -11-04)"),
    "H100": (3.0e12, 7.98e14, "the device tool's H100s as measured there"),
}


def ceilings(device_kind: str) -> tuple[float, float, str]:
    """(bandwidth, matmul rate, a line naming whose they are) for floors on `device_kind`; an H100's, said so,
    for a device without figures here (a CPU, another GPU)."""
    for name, (bandwidth, rate, source) in CEILINGS.items():
        if name in device_kind:
            return bandwidth, rate, source
    bandwidth, rate, source = CEILINGS["H100"]
    return bandwidth, rate, f"{source}: no figures for a {device_kind or 'device of unknown kind'}"


def floor_rates(device_kind: str, bandwidth: float | None, matmul_rate: float | None) -> tuple[float, float, str]:
    """--bandwidth and --matmul-rate where given, else `device_kind`'s ceilings, and a line saying which."""
    default_bandwidth, default_rate, source = ceilings(device_kind)
    line = (f"# floors at {(bandwidth or default_bandwidth) / 1e12:.2f} TB/s and "
            f"{(matmul_rate or default_rate) / 1e12:.0f} TFLOP/s" + (
                f": {source}" if bandwidth is None or matmul_rate is None else ": as given"))
    return bandwidth or default_bandwidth, matmul_rate or default_rate, line


def array_bytes(text: str) -> int:
    """Bytes of every array shape written in `text` (a shape, or a tuple of shapes)."""
    total = 0
    for dtype, dims in _ARRAY.findall(text):
        count = 1
        for size in filter(None, dims.split(",")):
            count *= int(size)
        total += count * DTYPE_BYTES[dtype]
    return total


def _dims(shape: str) -> list[int]:
    match = _ARRAY.search(shape)
    return [int(size) for size in filter(None, match.group(2).split(","))] if match else []


@dataclasses.dataclass
class Instruction:
    name: str
    shape: str  # the result's shape text
    op: str
    rest: str  # operands and attributes

    @property
    def operands(self) -> list[str]:
        depth, end = 1, 0
        for end, char in enumerate(self.rest):
            depth += char == "("
            depth -= char == ")"
            if depth == 0:
                break
        return re.findall(r"%([\w.\-]+)", self.rest[:end])

    def attribute(self, name: str) -> str | None:
        match = re.search(name + r"=([^,\s]+)", self.rest)
        return match.group(1) if match else None


def parse_hlo(text: str) -> tuple[str, dict[str, list[Instruction]]]:
    """(entry name, {computation: instructions}) of an HLO module's text."""
    computations, entry, current = {}, None, None
    for line in text.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header.group(2)
            computations[current] = []
            entry = current if header.group(1) else entry
        elif current is not None and line.strip() == "}":
            current = None
        elif current is not None:
            match = _INSTRUCTION.match(line)
            if match:
                computations[current].append(Instruction(*match.groups()))
    return entry, computations


def dot_flops(computations: dict[str, list[Instruction]], name: str) -> int:
    """2 x output elements x contracted size of every dot in a computation and those it calls."""
    shapes = {i.name: i.shape for i in computations.get(name, [])}
    flops = 0
    for instruction in computations.get(name, []):
        if instruction.op == "dot":
            out = 1
            for size in _dims(instruction.shape):
                out *= size
            lhs = _dims(shapes.get(instruction.operands[0], ""))
            contracted = 1
            for axis in filter(None, (instruction.attribute("lhs_contracting_dims") or "{}").strip("{}").split(",")):
                contracted *= lhs[int(axis)]
            flops += 2 * out * contracted
        for callee in re.findall(r"(?:calls|to_apply)=%([\w.\-]+)", instruction.rest):
            flops += dot_flops(computations, callee)
    return flops


def cublas_flops(instruction: "Instruction", shapes: dict[str, str]) -> int:
    """2 x output elements x contracted size of a cuBLAS call (the products an H100's autotuner picks, and what
    `gpu_aot.compile_lowered` compiles): the contraction from its backend config, the output the tuple's first
    array (the second is cuBLAS's workspace)."""
    match = re.search(r'"lhs_contracting_dimensions":\[([^\]]*)\]', instruction.rest)
    if not match:
        return 0
    lhs = _dims(shapes.get(instruction.operands[0], ""))
    contracted = 1
    for axis in filter(None, (a.strip().strip('"') for a in match.group(1).split(","))):
        contracted *= lhs[int(axis)]
    out = 1
    for size in _dims(instruction.shape):
        out *= size
    return 2 * out * contracted


def is_cublas(instruction: "Instruction") -> bool:
    return instruction.op == "custom-call" and 'custom_call_target="__cublas' in instruction.rest


@dataclasses.dataclass
class Kernel:
    name: str
    kind: str  # "matmul", "attention" or "other"
    flops: int
    writes: int
    reads: int  # its operands: whole, or the slices of those a fusion only slices
    source: str  # the model code's op name, layers merged

    def floor(self, bandwidth: float, matmul_rate: float) -> tuple[float, float]:
        """Seconds this kernel needs at least, as a range: a product its FLOPs (or its output's bytes, if more);
        any other kernel from writing its outputs once to reading all its operands as well."""
        if self.kind == "matmul":
            seconds = max(self.flops / matmul_rate, self.writes / bandwidth)
            return seconds, seconds
        return self.writes / bandwidth, (self.writes + self.reads) / bandwidth


def _sliced_bytes(value: Instruction, users: dict[str, list[Instruction]]) -> int | None:
    """Bytes read of a fused computation's value that is only sliced, through bitcasts (which move nothing); None
    when some use reads it whole."""
    total = 0
    for user in users.get(value.name, []):
        if user.op in ("slice", "dynamic-slice"):
            total += array_bytes(user.shape)
        elif user.op == "bitcast":
            inner = _sliced_bytes(user, users)
            if inner is None:
                return None
            total += inner
        else:
            return None
    return total


def _parameters(body: list[Instruction]) -> dict[int, Instruction]:
    return {int(i.rest.split(")")[0]): i for i in body if i.op == "parameter"}


def in_place_update(computations: dict[str, list[Instruction]], callee: str | None) -> tuple[int, int] | None:
    """(operand index, bytes written) of a fusion that updates one of its operands in place: its root is a
    dynamic-update-slice of a parameter into an array of the parameter's own shape, which XLA emits writing only
    the update into the operand's buffer (then the fusion's output). None for any other fusion."""
    body = computations.get(callee, []) if callee else []
    if not body or body[-1].op != "dynamic-update-slice":
        return None
    root = body[-1]
    shapes = {i.name: i.shape for i in body}
    target, update = root.operands[:2]
    for index, parameter in _parameters(body).items():
        if parameter.name == target and array_bytes(parameter.shape) == array_bytes(root.shape):
            return index, array_bytes(shapes.get(update, ""))
    return None


def operand_reads(computations: dict[str, list[Instruction]], callee: str | None, operand_shapes: list[str]
                  ) -> int:
    """Bytes a kernel reads of its operands: each whole, but an operand the fused computation `callee` only slices
    counts as those slices (at most the whole operand), and one it updates in place (`in_place_update`) as
    nothing."""
    body = computations.get(callee, []) if callee else []
    parameters = _parameters(body)
    users: dict[str, list[Instruction]] = collections.defaultdict(list)
    for instruction in body:
        for name in instruction.operands:
            users[name].append(instruction)
    updated = in_place_update(computations, callee)
    total = 0
    for index, shape in enumerate(operand_shapes):
        if updated is not None and index == updated[0]:
            continue
        whole = array_bytes(shape)
        sliced = _sliced_bytes(parameters[index], users) if index in parameters else None
        total += whole if sliced is None else min(sliced, whole)
    return total


def kernels_of(text: str) -> list[Kernel]:
    """The entry computation's kernel launches, with their products' FLOPs and their operands' and outputs' bytes."""
    entry, computations = parse_hlo(text)
    shapes = {i.name: i.shape for i in computations[entry]}
    kernels = []
    for instruction in computations[entry]:
        if instruction.op not in KERNEL_OPS:
            continue  # parameters, bitcasts, tuples, constants: no launch
        flops = dot_flops(computations, instruction.name) if instruction.op == "dot" else 0
        written = array_bytes(instruction.shape)
        if is_cublas(instruction):
            flops = cublas_flops(instruction, shapes)
            written = array_bytes(_ARRAY.search(instruction.shape).group(0))  # not the workspace
        callee = instruction.attribute("calls")
        callee = callee.lstrip("%") if callee else None
        if callee:
            flops += dot_flops(computations, callee)
        pallas = any(target in instruction.rest for target in PALLAS_TARGETS)
        kind = ("matmul" if flops else "other") if not pallas else next(
            (kind for prefix, kind in PALLAS_KINDS.items() if prefix in instruction.rest), "attention")
        op_name = re.search(r'op_name="([^"]*)"', instruction.rest)
        source = instruction.op
        if op_name:  # "jit(step)/transpose(jvp(Model))/.../layers_3/mlp/mul" -> "backward .../layers_N/mlp/mul"
            path = re.sub(r"layers_\d+", "layers_N", op_name.group(1)).split("/")
            source = ("backward " if "transpose(" in op_name.group(1) else "") + "/".join(path[-3:])
        fused = callee if instruction.op == "fusion" else None
        reads = operand_reads(computations, fused, [shapes.get(name, "") for name in instruction.operands])
        updated = in_place_update(computations, fused)
        if updated is not None:
            written = updated[1]
        kernels.append(Kernel(instruction.name, kind, flops, written, reads, source))
    return kernels


def summary(kernels: list[Kernel], bandwidth: float, matmul_rate: float, top: int = 8) -> str:
    matmul = [k for k in kernels if k.kind == "matmul"]
    other = [k for k in kernels if k.kind == "other"]
    attention = [k for k in kernels if k.kind == "attention"]
    pallas = {kind: [k for k in kernels if k.kind == kind] for kind in PALLAS_KINDS.values()}
    pallas = {kind: found for kind, found in pallas.items() if found}
    flops = sum(k.flops for k in matmul)
    writes, moved = sum(k.writes for k in other), sum(k.writes + k.reads for k in other)
    ms = lambda seconds: f"{seconds * 1e3:.1f} ms"
    lines = [f"kernels: {len(kernels)} ({len(matmul)} with matrix products, {len(attention)} Pallas attention, "
             + "".join(f"{len(found)} Pallas {kind}, " for kind, found in pallas.items()) + f"{len(other)} other)",
             f"matrix products: {flops / 1e12:.2f} TFLOP, {ms(flops / matmul_rate)} at {matmul_rate / 1e12:.0f} "
             "TFLOP/s",
             f"other kernels: write {writes / 1e9:.1f} GB, read and write at most {moved / 1e9:.1f} GB: "
             f"{ms(writes / bandwidth)} to {ms(moved / bandwidth)} at {bandwidth / 1e12:.1f} TB/s",
             f"Pallas attention kernels: read and write at most "
             f"{sum(k.writes + k.reads for k in attention) / 1e9:.1f} GB",
             *(f"Pallas {kind} kernels: write {sum(k.writes for k in found) / 1e9:.1f} GB, read and write at most "
               f"{sum(k.writes + k.reads for k in found) / 1e9:.1f} GB: "
               f"{ms(sum(k.writes + k.reads for k in found) / bandwidth)} at {bandwidth / 1e12:.1f} TB/s"
               for kind, found in pallas.items()),
             f"largest other kernels by the code that made them (at most, {bandwidth / 1e12:.1f} TB/s):"]
    by_source = collections.Counter()
    for kernel in other:
        by_source[kernel.source] += kernel.writes + kernel.reads
    for source, moved_bytes in by_source.most_common(top):
        lines.append(f"  {ms(moved_bytes / bandwidth):>8}  {source}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", default=None, help="compile for this GPU without one (h100, h200)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--documents-per-row", type=int, default=4)
    parser.add_argument("--remat", default="none")
    parser.add_argument("--attention", default="auto",
                        help="the attention implementation (bertjax.ops.attention.IMPLEMENTATIONS, or auto)")
    parser.add_argument("--norm", default="xla", choices=["xla", "pallas_gpu"], help="the norm implementation")
    parser.add_argument("--fused-qkv", action="store_true",
                        help="attention on the stacked q/k/v projection (EncoderConfig.attention_fused_qkv)")
    parser.add_argument("--glu", default="xla", choices=["xla", "pallas_gpu"],
                        help="the gated MLP's implementation (EncoderConfig.glu_implementation)")
    parser.add_argument("--bandwidth", type=float, default=None,
                        help="bytes/s, read plus written (default: the target device's, CEILINGS)")
    parser.add_argument("--matmul-rate", type=float, default=None,
                        help="FLOP/s of the matrix products (default: the target device's, CEILINGS)")
    parser.add_argument("--hlo-out", default=None, help="also write the optimized HLO here")
    parser.add_argument("--xla-option", action="append", default=[], metavar="NAME=VALUE",
                        help="an XLA compiler option for this compile (repeatable), e.g. "
                             "xla_gpu_experimental_enable_triton_heroless_priority_fusion=true")
    args = parser.parse_args(argv)
    for option in args.xla_option:
        if "=" not in option or not option.split("=", 1)[0]:
            parser.error(f"--xla-option takes NAME=VALUE, got {option!r}")
    return args


def xla_option_value(text: str):
    """A compiler option's value as XLA's option parser wants it: a bool or int where the text is one."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.topology:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "-1")  # compile-only devices; no GPU is asked for
    import jax

    from bench.train_bench import Case, gpu_config, synthetic_batch
    from bertjax.data.global_batch import batch_sharding
    from bertjax.train import mesh as mesh_lib
    from bertjax.train.setup import setup_run

    devices, platform = None, None
    if args.topology:
        from bertjax import gpu_aot

        devices, platform = gpu_aot.gpu_devices(args.topology), "gpu"
    case = Case("floor", gpu_config(args.seq, attention=args.attention, norm=args.norm, fused_qkv=args.fused_qkv,
                                    glu=args.glu),
                batch=args.batch, seq_len=args.seq, documents_per_row=args.documents_per_row, remat_policy=args.remat)
    setup = setup_run(case.run_config(2), vocab_size=case.config.vocab_size, pad_id=case.config.pad_token_id,
                      devices=devices, attention_platform=platform, compile_only=devices is not None)
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding(setup.mesh, mesh_lib.BATCH_AXES))
             for k, v in synthetic_batch(case).items()}
    options = {name: xla_option_value(value) for name, value in (o.split("=", 1) for o in args.xla_option)}
    # XLA's default, not gpu_aot.compile_lowered's cuBLAS products: its fusions are the card's (the second lease's
    # HLO of this step has the same 1,825 kernels and bytes, its products swapped for cuBLAS calls by the autotuner),
    # while compiling with cuBLAS products fuses differently.
    text = setup.train_step.lower(setup.abstract_state(), setup.frozen, batch).compile(options or None).as_text()
    if args.hlo_out:
        with open(args.hlo_out, "w") as f:
            f.write(text)
    target = args.topology or jax.devices()[0].device_kind
    kind = gpu_aot.TARGETS[gpu_aot.parse_topology(args.topology)[0]][0] if args.topology else target
    bandwidth, matmul_rate, rates = floor_rates(kind, args.bandwidth, args.matmul_rate)
    print(f"# modernbert-base train step, {args.batch} x {args.seq}, {args.documents_per_row} documents per row, "
          f"remat {args.remat}, compiled for {target} (jax {jax.__version__}); attention "
          f"{setup.model_config.attention_implementation}"
          f"{' on the stacked q/k/v' if setup.model_config.attention_fused_qkv else ''}, norm "
          f"{setup.model_config.norm_implementation}, GLU {setup.model_config.glu_implementation}")
    print(rates)
    print(summary(kernels_of(text), bandwidth, matmul_rate))


if __name__ == "__main__":
    main()
