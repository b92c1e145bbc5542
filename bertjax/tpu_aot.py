"""Compile for a real TPU topology on a machine without one, and read the compiled program's memory.

With the `libtpu` wheel installed (`pip install "bertjax[tpu-aot]"`), `jax.experimental.topologies` describes a TPU
slice (e.g. "v5e:2x2", four chips) whose devices can compile but not run. XLA then does the same sharding
propagation, Mosaic (Pallas TPU) kernel compilation and buffer assignment as on the real slice, so a program that
compiles here fits (or not) on the real chips, per `memory_analysis()`.

    mesh = topology_mesh("v5e:2x2", {"data": 4})
    compiled = aot_compile(step, abstract_params, abstract_batch, mesh=mesh,
                           in_shardings=(replicated, data_sharded), logical_axis_rules=rules)
    print(memory_report(compiled))

Arguments are `jax.ShapeDtypeStruct` pytrees: nothing is allocated. Works with JAX_PLATFORMS=cpu.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import topologies
from jax.sharding import AxisType, Mesh

EXAMPLE_TOPOLOGIES = ("v4:2x2x1", "v5e:2x2", "v5e:4x4", "v5p:2x2x1", "v5p:2x2x2", "v6e:2x2")
MEGACORE = ("v4",)  # generations whose chips libtpu splits into one device per TensorCore unless told otherwise
INSTALL_HINT = ('AOT compilation for TPU needs the libtpu wheel that matches the installed jax: pip install '
                '"bertjax[tpu-aot]" (in a clone: pip install -e ".[tpu-aot]")')


def libtpu_available() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def _accelerator_type_hint(name: str) -> str:
    """For a Cloud TPU accelerator type (what launch/tpu_pod.sh takes), how many chips it is: v4 and v5p types
    count TensorCores, two per chip; v5e (v5litepod) and v6e types count chips."""
    match = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e)-(\d+)", name.strip().lower())
    if match is None:
        return ""
    generation, count = match.groups()
    chips = int(count) // 2 if generation in ("v4", "v5p") else int(count)
    generation = "v5e" if generation == "v5litepod" else generation
    if generation in ("v4", "v5p"):  # 3-D tori
        shape = f"2x2x{chips // 4}" if chips % 4 == 0 else f"1x1x{chips}"
    else:
        side = math.isqrt(chips)
        while chips % side:
            side -= 1
        shape = f"{side}x{chips // side}"
    return f". The accelerator type {name} is {chips} chip(s), e.g. --topology {generation}:{shape}"


def topology_devices(topology: str = "v5e:2x2") -> list:
    """Compile-only devices of a TPU topology such as "v5e:2x2", "v5p:2x2x1", "v4:2x2x1"."""
    if ":" not in topology:  # libtpu reads "" (and other names without a shape) as its default slice, silently
        raise ValueError(f"TPU topology {topology!r}: expected GENERATION:SHAPE, e.g. {', '.join(EXAMPLE_TOPOLOGIES)}; "
                         f"NVIDIA GPUs: h100, h200 (h100:8 for eight){_accelerator_type_hint(topology)}")
    if not libtpu_available():
        raise RuntimeError(INSTALL_HINT)
    # libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) so two processes cannot drive one TPU. Compile-only
    # devices drive nothing, so concurrent compile checks (tests, other jobs) may share the library.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # A v4 chip's two TensorCores are two devices in libtpu's default chip config; a v4 VM runs them as one device
    # per chip ("megacore"), the layout jax.make_mesh requires of TPUs after v3.
    chip_config = {"chip_config_name": "megacore"} if topology.split(":")[0].lower() in MEGACORE else {}
    try:
        return list(topologies.get_topology_desc(topology_name=topology, platform="tpu", **chip_config).devices)
    except jax.errors.JaxRuntimeError as error:  # libtpu's own words name what is wrong with the name
        reason = str(error).strip().splitlines()[0].removeprefix("INVALID_ARGUMENT: ")
        raise ValueError(f"TPU topology {topology!r} cannot be compiled for: {reason}. Examples of valid ones: "
                         f"{', '.join(EXAMPLE_TOPOLOGIES)}; NVIDIA GPUs: h100, h200 (h100:8 for eight)") from None


def topology_mesh(topology: str = "v5e:2x2", axes: dict[str, int] | None = None) -> Mesh:
    """A mesh over the topology's devices; `axes` maps names to sizes (default: one "data" axis over all chips).

    Axis types are Auto, so the sharding of intermediates is left to XLA's propagation, as in training.
    """
    devices = topology_devices(topology)
    axes = axes or {"data": len(devices)}
    if math.prod(axes.values()) != len(devices):
        raise ValueError(f"mesh axes {axes} need {math.prod(axes.values())} devices; topology {topology!r} has "
                         f"{len(devices)}")
    grid = np.array(devices, dtype=object).reshape(tuple(axes.values()))
    return Mesh(grid, tuple(axes), axis_types=(AxisType.Auto,) * len(axes))


def aot_compile(fn: Callable, *args: Any, mesh: Mesh, in_shardings: Any, out_shardings: Any = None,
                donate_argnums: int | Sequence[int] = (), logical_axis_rules: Sequence | None = None,
                print_memory: bool = True) -> jax.stages.Compiled:
    """jit(fn) lowered for `args` (ShapeDtypeStruct pytrees) and compiled for the mesh's devices.

    The mesh is set (`jax.set_mesh`) while tracing so that code which needs it (shard_map around Pallas TPU
    kernels) finds it, and so are the Flax `logical_axis_rules` when given (`nn.with_logical_constraint`).
    """
    jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate_argnums)
    rules = nn.logical_axis_rules(logical_axis_rules) if logical_axis_rules is not None else contextlib.nullcontext()
    with jax.set_mesh(mesh), rules:
        compiled = jitted.lower(*args).compile()
    if print_memory:
        print(memory_report(compiled))
    return compiled


def device_bytes(stats) -> int:
    """What a compiled program holds on each device at its peak, from its `memory_analysis()`: arguments and outputs
    (less the outputs aliased onto donated arguments) and temporaries."""
    return (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
            + stats.temp_size_in_bytes)


def memory_report(compiled: jax.stages.Compiled) -> str:
    """Per-device memory of a compiled program, in MiB, one field per line (from `memory_analysis()`)."""
    stats = compiled.memory_analysis()
    if stats is None:
        return "memory_analysis: not available for this backend"
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
              "generated_code_size_in_bytes")
    lines = [f"  {name.removesuffix('_size_in_bytes'):<15} {getattr(stats, name) / 2**20:10.1f} MiB" for name in fields]
    lines.append(f"  {'total (a+o-al+t)':<15} {device_bytes(stats) / 2**20:10.1f} MiB per device")
    return "memory_analysis (per device):\n" + "\n".join(lines)
