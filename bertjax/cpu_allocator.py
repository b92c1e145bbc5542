"""Keep the memory XLA frees on CPU, instead of giving it back to the kernel at the end of every step.

Why: XLA's CPU runtime allocates each execution's temporaries as one block (tiny.yaml's train step: 395 MB) and
frees it when the execution ends. glibc serves a block that large to a worker thread with a fresh `mmap` and
unmaps it on `free`, so every step starts by page-faulting the whole block back in: 97,000 page faults per step,
a third of tiny.yaml's single-thread step spent in the kernel (docs/benchmarks.md, issue 17). Three `mallopt`
settings make glibc reuse the block: one arena (XLA's threads then allocate from the main heap, which unlike a
thread arena can hold a block that size), no `mmap` for large blocks, and no trimming of the heap's top. The cost
is that the process keeps its peak heap instead of returning it to the system, which is what a training or
inference process wants; a long-lived process whose allocation sizes vary a lot may see its heap fragment.

It only pays where XLA computes on the CPU, and must run before XLA starts its threads (before the first
computation), so `bertjax`'s command line calls it when the run is on CPU; notebooks and scripts can call
`reuse_freed_memory()` themselves. glibc on Linux only; elsewhere it does nothing. BERTJAX_MALLOC=system turns it
off.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

# mallopt parameter numbers from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int: the largest threshold it can express


def reuse_freed_memory() -> bool:
    """Tune glibc's allocator so that freed blocks are reused, not unmapped; True if it was applied."""
    if os.environ.get("BERTJAX_MALLOC") == "system":
        return False
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER_TRIM))
    return all(mallopt(parameter, value) == 1 for parameter, value in settings)
