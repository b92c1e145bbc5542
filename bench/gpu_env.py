"""What a GPU machine holds, printed first in a device lease (launch/gpu_session.sh, stage env): the versions of the
packages the benchmarks use, the CUDA libraries (cuDNN, cuBLAS, JAX's CUDA plugin) as packaged and as JAX and torch
load them, and the devices JAX and torch see, so every number after it can name its toolchain.

    python -m bench.gpu_env
"""

from __future__ import annotations

import argparse
import importlib.metadata

PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint", "chex",
            "grain", "transformers", "sentence-transformers", "torch", "triton", "numpy")
# CUDA libraries by the names their wheels take on CUDA 13 and 12 (both kinds of image exist): each line prints the
# ones installed, so a cuDNN or cuBLAS difference between two leases shows in their logs.
CUDA_PACKAGES = {"cuDNN": ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12"),
                 "cuBLAS": ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"),
                 "CUDA runtime": ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"),
                 "JAX's CUDA PJRT": ("jax-cuda13-pjrt", "jax-cuda12-pjrt")}
# What jaxlib's CUDA plugin reports it loaded (jax._src.lib.cuda_versions, private: read only where it is there).
JAX_CUDA_VERSIONS = ("cuda_driver_get_version", "cuda_runtime_get_version", "cuda_runtime_build_version",
                     "cudnn_get_version", "cudnn_build_version", "cublas_get_version", "cufft_get_version")


def parse_args(argv=None) -> argparse.Namespace:
    return argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
                                   ).parse_args(argv)


def version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cuda_package_lines() -> list[str]:
    lines = []
    for library, names in CUDA_PACKAGES.items():
        found = [f"{name} {version(name)}" for name in names if version(name)]
        lines.append(f"{library} package: {', '.join(found) or 'none of ' + ', '.join(names)}")
    return lines


def jax_cuda_lines() -> list[str]:
    """The CUDA library versions JAX's plugin loaded, or why there are none (a CPU jaxlib, another JAX)."""
    try:
        from jax._src.lib import cuda_versions
    except Exception as error:  # noqa: BLE001: a private module; its absence is an answer, not a failure
        return [f"JAX's CUDA libraries: not readable ({type(error).__name__})"]
    if cuda_versions is None:
        return ["JAX's CUDA libraries: no CUDA plugin loaded"]
    lines = []
    for name in JAX_CUDA_VERSIONS:
        try:
            lines.append(f"JAX {name}: {getattr(cuda_versions, name)()}")
        except Exception as error:  # noqa: BLE001
            lines.append(f"JAX {name}: not readable ({type(error).__name__})")
    return lines


def torch_cuda_lines(torch) -> list[str]:
    lines = [f"torch CUDA {torch.version.cuda}"]
    try:
        lines.append(f"torch cuDNN {torch.backends.cudnn.version()}")
    except Exception as error:  # noqa: BLE001
        lines.append(f"torch cuDNN: not readable ({type(error).__name__})")
    return lines


def main(argv=None) -> None:
    parse_args(argv)
    for name in PACKAGES:
        print(name, version(name) or "not installed")
    print("\n".join(cuda_package_lines()))
    import jax

    print("jax devices:", jax.devices(), jax.devices()[0].device_kind)
    try:
        import jax.extend.backend

        print("XLA:", jax.extend.backend.backend_xla_version())
    except Exception as error:  # noqa: BLE001: not in every JAX
        print(f"XLA: not readable ({type(error).__name__})")
    print("\n".join(jax_cuda_lines()))
    import torch

    if torch.cuda.is_available():
        print("torch device:", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))
    else:
        print("torch sees no CUDA device")
    print("\n".join(torch_cuda_lines(torch)))
    import bertjax  # noqa: F401: the package imports with what this machine holds

    print("bertjax imports")


if __name__ == "__main__":
    main()
