"""A quiet start on machines without a TPU, when the `libtpu` wheel is installed (the `tpu-aot` extra).

JAX tries every backend it knows, TPU first. With libtpu installed on a CPU or GPU machine, that attempt fails,
but only after libtpu has printed warnings and an `E0000 ... unexpected worker hostname` error (it looks for a
TPU slice that is not there) and left a log file under `<tmp>/tpu_logs`. `quiet_start()` prevents both:

- no TPU chip on this machine and no JAX_PLATFORMS chosen by the user: JAX skips the TPU backend (CPU machine:
  "cpu"; GPU machine: the platforms JAX would find anyway, minus the TPU attempt; see `_platforms_without_tpu`);
- libtpu still loads for `bertjax compile-check` (compile-only TPU devices): it is told to log only fatal errors,
  to write no log files, and that this host is a single worker, so it neither warns nor complains.

A TPU VM is left alone: JAX finds its chips and libtpu logs as usual. Every variable is set only when the user
has not set it.
"""

from __future__ import annotations

import functools
import glob
import os

# libtpu reads these when it loads. Level 3 = FATAL only: no warnings on stderr and no log file in tpu_logs.
_QUIET_LIBTPU = {
    "TPU_MIN_LOG_LEVEL": "3",
    "TPU_STDERR_LOG_LEVEL": "3",
    # Without these libtpu looks up the slice's workers and host bounds (GCE metadata), then warns and logs an
    # INVALID_ARGUMENT error. A machine without chips is one host of one worker.
    "TPU_WORKER_HOSTNAMES": "localhost",
    "TPU_HOST_BOUNDS": "1,1,1",
}


@functools.cache  # the chips do not change under a process; `import bertjax` and the CLI both ask
def has_tpu_chips() -> bool:
    """TPU chips attached to this machine: /dev/accel* (v2-v4) or /dev/vfio/<n> (v5+), or Google PCI devices."""
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return True
    try:
        from jax._src import hardware_utils  # what JAX itself consults (reads /sys/bus/pci, loads no backend)
    except ImportError:
        return False
    return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0


def has_nvidia_gpu() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


def _platforms_without_tpu() -> str | None:
    """The JAX_PLATFORMS value that skips only the TPU attempt; None where JAX's own choice is already quiet."""
    if has_nvidia_gpu():
        return None  # GPU machines keep JAX's discovery of the CUDA plugin; libtpu is silenced by the env above
    return "cpu"


def quiet_libtpu() -> None:
    """libtpu's settings for a machine without chips, where the user has set none (`import bertjax` does this, so
    a script's first JAX computation prints no libtpu error): nothing changes which backends JAX uses."""
    if has_tpu_chips():
        return
    for name, value in _QUIET_LIBTPU.items():
        os.environ.setdefault(name, value)


def quiet_start() -> None:
    """Call before the first JAX computation (the CLI does, before running a command): `quiet_libtpu`, and JAX
    told to skip the TPU attempt where there is no chip."""
    if has_tpu_chips():
        return
    quiet_libtpu()
    if os.environ.get("JAX_PLATFORMS"):
        return  # the user's choice
    platforms = _platforms_without_tpu()
    if platforms is None:
        return
    import jax

    jax.config.update("jax_platforms", platforms)  # read when the first computation initialises the backends
