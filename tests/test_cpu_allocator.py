"""`reuse_freed_memory`: XLA's per-execution temporaries are reused on CPU instead of page-faulted in every call.

Measured in fresh processes (the setting must precede XLA's threads): minor page faults per call of a jitted
function whose temporaries take ~64 MB, with the tuning and with BERTJAX_MALLOC=system (glibc's default).
"""

import os
import platform
import subprocess
import sys

import pytest

SCRIPT = r"""
import resource, sys
from bertjax.cpu_allocator import reuse_freed_memory
applied = reuse_freed_memory()
import jax, jax.numpy as jnp

@jax.jit
def f(x):  # temporaries of 4 x 16 MB that XLA frees at the end of every call
    a = jnp.sin(x) @ x
    b = jnp.cos(a) @ x
    return (jnp.tanh(b) @ a).sum()

x = jnp.ones((2048, 2048)) / 2048
f(x).block_until_ready()
f(x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    f(x).block_until_ready()
print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 5)
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
def test_temporaries_are_reused_instead_of_page_faulted_every_call():
    applied, tuned = _faults_per_call(None)
    kept_default, default = _faults_per_call("system")
    assert applied and not kept_default
    # 16 MB is 4,096 pages: glibc's default faults each freed block in again on every call; tuned, nearly nothing.
    assert default > 4096, default
    assert tuned < default / 10, (tuned, default)
