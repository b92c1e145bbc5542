"""Lowering Pallas Triton kernels for CUDA on a machine without a GPU, shared by the GPU kernel tests.

JAX 0.10 lowers Triton for CUDA anywhere (assuming sm_90); JAX 0.11 asks the device for its compute capability, so
without a GPU the lowering runs on an abstract H100 (`abstract_h100`); under a mesh of CPU devices that cannot be,
and the callers skip. On a GPU machine everything lowers for the real device.
"""

from __future__ import annotations

import re

import jax
import pytest

# The custom call that carries a Pallas Triton kernel (the Triton IR, for XLA to compile); jaxlib 0.10.2 also
# holds a path, unused there, that compiles while lowering and calls the binary through an FFI target.
TRITON_CALLS = ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi")
# Lowering errors of JAX versions that ask the local GPU for its compute capability (0.11: "No supported GPU
# devices found" / "Unsupported GPU device kind") or compile Triton while lowering: no GPU here, not a kernel bug.
NEEDS_A_GPU = re.compile(r"No supported GPU devices|Unsupported GPU device kind|Triton compilation handler|"
                         r"Cannot infer architecture")


def export_for_cuda(fn, *args):
    """`jax.export` of jit(fn) for CUDA. Where this JAX needs a GPU to lower Triton (NEEDS_A_GPU) and no mesh is
    set, the export runs again on an abstract H100 (JAX 0.11's way to lower for a GPU that is not there); under a
    concrete mesh of CPU devices that cannot be, and the test skips."""
    export = jax.export.export(
        jax.jit(fn), platforms=["cuda"],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(name) for name in TRITON_CALLS])
    try:
        return export(*args)
    except (RuntimeError, ValueError) as error:
        if not NEEDS_A_GPU.search(str(error)):
            raise
        if jax.sharding.get_abstract_mesh().empty:
            with abstract_h100():
                return export(*args)
        pytest.skip(f"this JAX reads the GPU's compute capability while lowering a Triton kernel ({error}): run on "
                    f"a GPU machine, e.g. JAX_PLATFORMS=cuda,cpu")


def triton_kernels(exported) -> list[str]:
    """Sorted names of the Triton kernels in an exported program, one per custom call."""
    text = exported.mlir_module()
    calls = len(re.findall(r'custom_call @"?(?:' + "|".join(map(re.escape, TRITON_CALLS)) + r')"?\(', text))
    names = sorted(re.findall(r'name = "(bertjax_[a-z_]+)"', text))
    assert calls == len(names), (calls, names)
    return names


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


def triton_operand_shapes(exported) -> list[tuple[int, ...]]:
    """The distinct 4-d operand and result shapes of the Triton calls in an exported program: the q/k/v/out blocks
    as a kernel sees them, the whole batch or one device's shard."""
    pattern = r'custom_call @"?(?:' + "|".join(map(re.escape, TRITON_CALLS)) + r')"?\('
    calls = [line for line in exported.mlir_module().splitlines() if re.search(pattern, line)]
    return sorted({tuple(map(int, dims.split("x"))) for line in calls
                   for dims in re.findall(r"tensor<(\d+x\d+x\d+x\d+)x[a-z]", line.rsplit(" : (", 1)[1])})


def triton_ir(fn, *args) -> list[tuple[str, str, int, int]]:
    """(kernel name, Triton IR as text, num_warps, num_stages) of every Triton call in jit(fn) lowered for CUDA.
    Skips where the HLO carries no Triton IR; lowers on an abstract H100 where this JAX needs a GPU (NEEDS_A_GPU)."""
    triton_dialect = pytest.importorskip("jaxlib.triton.dialect")
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
        if op.name == "stablehlo.custom_call" and ir.StringAttr(op.attributes["call_target_name"]).value in TRITON_CALLS:
            configs.append(ir.DictAttr(op.attributes["mhlo.backend_config"]))
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    visit(inner)

    with module.context:
        visit(module.operation)
        if not configs or "ir" not in configs[0]:
            pytest.skip("this jaxlib keeps no Triton IR in the HLO")
        raw = [(ir.StringAttr(c["name"]).value, ir.StringAttr(c["ir"]).value_bytes,
                ir.IntegerAttr(c["num_warps"]).value, ir.IntegerAttr(c["num_stages"]).value) for c in configs]
    context = ir.Context()
    triton_dialect.register_dialect(context)
    with context:
        return [(name, ir.Module.parse(blob).operation.get_asm(), warps, stages) for name, blob, warps, stages in raw]
