"""Compile for NVIDIA GPUs on a machine without one: XLA's deviceless GPU compilation.

With JAX's CUDA plugin installed (`pip install "jax[cuda13]"`: the plugin and CUDA's compiler libraries, several
GB; no GPU or driver needed), `jax.experimental.topologies` builds compile-only CUDA devices from a target
description (the GPU's compute capability, SM count, shared memory and registers per block, memory size). XLA then
runs its whole GPU pipeline on them: fusion, the Triton compilation of bertjax's Pallas kernels, buffer
assignment. What compiles here compiles on the card, and `memory_analysis()` says what the program holds on it.
No autotuning happens without a device, so compile time and speed differ from the card's; `compile_lowered` makes
the one choice the autotuner is known to make on Hopper (COMPILER_OPTIONS), which brought the program's memory to
within 4% of the card's where it was compared (modernbert-base's step at 24 rows of 8192; 11% without it).

    devices = gpu_devices("h100")            # or "h100:8", "h200"
    setup = setup_run(..., devices=devices, attention_platform="gpu", compile_only=True)   # bertjax compile-check
    compiled = compile_lowered(setup.train_step.lower(...))

TARGETS' figures are those of the device tool's machines (KINDS.md: device memory as nvidia-smi reported it, SM
count and L2 as PyTorch did) and NVIDIA's published Hopper limits (228 KB of shared memory per SM, 227 KB per block
opt-in, 64K registers).
"""

from __future__ import annotations

import importlib.util
import os
import re

# Hopper's per-SM and per-block limits (compute capability 9.0), the same for the H100 SXM and the H200.
HOPPER = dict(compute_major=9, compute_minor=0, sms=132, threads_per_block=1024, threads_per_sm=2048,
              shared_per_block=48 * 1024, shared_per_block_optin=232_448, shared_per_sm=233_472,
              registers_per_sm=65_536, registers_per_block=65_536, clock_ghz=1.98)
TARGETS = {
    # name: (device kind as CUDA reports it, device memory in bytes, memory bandwidth B/s, L2 bytes)
    "h100": ("NVIDIA H100 80GB HBM3", 81_559 * 2**20, 3_352_320_000_000, 50 * 2**20),
    "h200": ("NVIDIA H200", 143_771 * 2**20, 4_800_000_000_000, 60 * 2**20),
}
# Without a device XLA leaves every matrix product a Triton GEMM fusion. On an H100 the autotuner chose cuBLAS for
# all 270 products of modernbert-base's train step (the second lease's optimized HLO, 2026-11-27), and that changes
# what the program holds: at 24 rows of 8192 tokens its temporaries were 69.8 GiB on the card, 61.9 GiB compiled
# here with Triton GEMMs and 67.2 GiB with cuBLAS ones (docs/benchmarks.md, the second lease).
COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}
INSTALL_HINT = ('compiling for a GPU without one needs JAX\'s CUDA plugin: pip install "jax[cuda13]" (matching the '
                'installed jax; several GB of CUDA libraries, no GPU needed)')


def cuda_plugin_available() -> bool:
    return any(importlib.util.find_spec(name) is not None for name in ("jax_cuda13_plugin", "jax_cuda12_plugin"))


def is_gpu_topology(topology: str) -> bool:
    return topology.split(":")[0] in TARGETS


def parse_topology(topology: str) -> tuple[str, int]:
    """("h100", 8) from "h100:8"; "h100" alone is one GPU."""
    match = re.fullmatch(r"([a-z0-9]+)(?::(\d+))?", topology)
    if not match or match.group(1) not in TARGETS or (match.group(2) is not None and int(match.group(2)) < 1):
        raise ValueError(f"GPU topology {topology!r}: expected NAME or NAME:COUNT with NAME one of "
                         f"{', '.join(TARGETS)} (e.g. h100, h100:8)")
    return match.group(1), int(match.group(2) or 1)


def target_config(name: str) -> str:
    """XLA's GpuTargetConfig (text proto) of one of TARGETS."""
    kind, memory, bandwidth, l2 = TARGETS[name]
    h = HOPPER
    return f"""
gpu_device_info {{
  threads_per_block_limit: {h['threads_per_block']}
  threads_per_warp: 32
  shared_memory_per_block: {h['shared_per_block']}
  shared_memory_per_core: {h['shared_per_sm']}
  threads_per_core_limit: {h['threads_per_sm']}
  core_count: {h['sms']}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: {l2}
  clock_rate_ghz: {h['clock_ghz']}
  device_memory_size: {memory}
  shared_memory_per_block_optin: {h['shared_per_block_optin']}
  cuda_compute_capability {{ major: {h['compute_major']} minor: {h['compute_minor']} }}
  registers_per_core_limit: {h['registers_per_sm']}
  registers_per_block_limit: {h['registers_per_block']}
}}
platform_name: "CUDA"
device_description_str: "{kind}"
"""


def device_memory_gib(topology: str) -> float:
    return TARGETS[parse_topology(topology)[0]][1] / 2**30


def jax_memory_fraction() -> float:
    """The share of a GPU's memory JAX's allocator may use: XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 unless set."""
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))


def gpu_devices(topology: str = "h100") -> list:
    """Compile-only CUDA devices: "h100" (one), "h100:8" (eight on one host), "h200"."""
    name, count = parse_topology(topology)
    if not cuda_plugin_available():
        raise RuntimeError(INSTALL_HINT)
    from jax.experimental import topologies

    description = topologies.get_topology_desc(platform="cuda", target_config=target_config(name),
                                               topology=f"1x1x{count}")
    return list(description.devices)


def compile_lowered(lowered, **options):
    """`lowered.compile()` for compile-only GPU devices with COMPILER_OPTIONS (the card's cuBLAS products); `options`
    (XLA compiler options) are added to them or override them."""
    return lowered.compile({**COMPILER_OPTIONS, **options})
