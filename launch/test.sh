#!/usr/bin/env bash
# The test command (README): installs everything on a fresh machine, then runs the suite on CPU.
# The tpu-aot extra (libtpu) lets the suite AOT-compile for real TPU topologies on this CPU machine.
# torch comes first and pinned to the local CPU build, so nothing later pulls CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0
python3 -m pip install -q -e ".[test,tpu-aot]"
# Two workers, one test file each at a time (module fixtures stay in one process): most of the suite is XLA
# compiles and small single-threaded computations, which leave the second core idle in a single process. Files
# go out in collection order, which tests/conftest.py makes slowest first.
JAX_PLATFORMS=cpu python3 -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests "$@"
