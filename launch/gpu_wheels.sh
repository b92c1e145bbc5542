#!/usr/bin/env bash
# Download, on a machine with PyPI, the wheels that a GPU machine without network lacks, into .whl/ (git-ignored):
# the packages bertjax imports that CUDA images commonly do not hold (Grain and its record format, TensorBoard
# logging), which launch/gpu_session.sh installs into /tmp/site there when they are not importable; and, in .whl/fallback, the Flax, Optax, chex and
# Orbax versions the deviceless H100 compiles were checked with, which launch/gpu_session.sh installs there only if
# bertjax does not import with the image's own.
#
#   launch/gpu_wheels.sh [PYTHON_VERSION]      # default 3.12, the GPU image's python3
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-3.12}
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  grain==0.2.18 array_record==0.8.6 portpicker==1.6.0 tensorboardX==2.6.5
mkdir -p .whl/fallback
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY" --implementation cp -d .whl/fallback \
  flax==0.12.12 optax==0.2.8 chex==0.1.92 orbax-checkpoint==0.12.8
ls -l .whl .whl/fallback
