"""Lowering Pallas Triton kernels for CUDA on a machine without a GPU, shared by the GPU kernel tests.

JAX 0.10 lowers Triton for CUDA anywhere (assuming sm_90); JAX 0.11 asks the device for its compute capability, so
without a GPU the lowering runs on an abstract H100 (`abstract_h100`); under a mesh of CPU devices that cannot be,
and the callers skip. On a GPU machine everything lowers for the real device.
"""

from __future__ import annotations

import re

import jax
import pytest

from bench import pallas_gpu_static as static
from bench.pallas_gpu_static import NEEDS_A_GPU, TRITON_CALLS, abstract_h100, abstract_h100_mesh  # noqa: F401


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


def triton_operand_shapes(exported) -> list[tuple[int, ...]]:
    """The distinct 4-d operand and result shapes of the Triton calls in an exported program: the q/k/v/out blocks
    as a kernel sees them, the whole batch or one device's shard."""
    pattern = r'custom_call @"?(?:' + "|".join(map(re.escape, TRITON_CALLS)) + r')"?\('
    calls = [line for line in exported.mlir_module().splitlines() if re.search(pattern, line)]
    return sorted({tuple(map(int, dims.split("x"))) for line in calls
                   for dims in re.findall(r"tensor<(\d+x\d+x\d+x\d+)x[a-z]", line.rsplit(" : (", 1)[1])})


def triton_ir(fn, *args) -> list[tuple[str, str, int, int]]:
    """bench.pallas_gpu_static.triton_ir: (kernel name, Triton IR text, num_warps, num_stages) of every Triton call;
    skips where the HLO carries no Triton IR."""
    kernels = static.triton_ir(fn, *args)
    if kernels is None:
        pytest.skip("this jaxlib keeps no Triton IR in the HLO")
    return kernels
