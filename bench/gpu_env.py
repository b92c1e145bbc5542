"""What a GPU machine holds, printed first in a device lease (launch/gpu_session.sh, stage env): the versions of the
packages the benchmarks use, and the devices JAX and torch see, so every number after it can name its toolchain.

    python -m bench.gpu_env
"""

from __future__ import annotations

import argparse
import importlib.metadata

PACKAGES = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax", "orbax-checkpoint", "chex",
            "grain", "transformers", "sentence-transformers", "torch", "triton", "numpy")


def parse_args(argv=None) -> argparse.Namespace:
    return argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
                                   ).parse_args(argv)


def main(argv=None) -> None:
    parse_args(argv)
    for name in PACKAGES:
        try:
            print(name, importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            print(name, "not installed")
    import jax

    print("jax devices:", jax.devices(), jax.devices()[0].device_kind)
    import torch

    if torch.cuda.is_available():
        print("torch device:", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0))
    else:
        print("torch sees no CUDA device")
    import bertjax  # noqa: F401: the package imports with what this machine holds

    print("bertjax imports")


if __name__ == "__main__":
    main()
