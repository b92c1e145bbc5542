"""`reuse_freed_memory`: a large block freed by a worker thread is reused, not unmapped and page-faulted back in.

That is the pattern of XLA's CPU runtime (one block of temporaries per execution, from its worker threads; the
main job's page faults fell from 58.8M to 0.65M with it, docs/benchmarks.md). Measured in fresh processes (the
setting must precede the threads): minor page faults per allocate-write-free step of a 96 MB block, with the
tuning and with BERTJAX_MALLOC=system (glibc's default).
"""

import os
import platform
import subprocess
import sys

import pytest

SCRIPT = r"""
import ctypes, resource, sys, threading
from bertjax.cpu_allocator import reuse_freed_memory
applied = reuse_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
SIZE = 96 << 20  # as XLA does: one large block per execution, allocated, written and freed by a worker thread
faults = []

def steps():
    for _ in range(6):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(SIZE)
        libc.memset(block, 1, SIZE)
        libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

worker = threading.Thread(target=steps)
worker.start()
worker.join()
print(applied, sum(faults[1:]) // 5)
"""


def _faults_per_call(malloc_setting: str | None) -> tuple[bool, int]:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("BERTJAX_MALLOC", None)
    if malloc_setting:
        env["BERTJAX_MALLOC"] = malloc_setting
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    applied, faults = out.stdout.split()[-2:]
    return applied == "True", int(faults)


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="a glibc tuning")
def test_a_freed_large_block_is_reused_instead_of_page_faulted_every_step():
    applied, tuned = _faults_per_call(None)
    kept_default, default = _faults_per_call("system")
    assert applied and not kept_default
    # 96 MB is 24,576 pages: glibc's default maps a fresh block every step; tuned, the freed block is reused.
    assert default > 20_000, default
    assert tuned < 1_000, tuned
