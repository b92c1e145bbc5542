#!/usr/bin/env bash
# Pretrain on one GPU host, over all of its GPUs (one process; the mesh's data axis spans the GPUs).
#
#   launch/gpu_host.sh CONFIG WORKDIR [key=value ...]
#   launch/gpu_host.sh configs/pretrain/roberta-base.yaml runs/roberta-base data.global_batch_size=256
#
# Installs JAX for CUDA (JAX_PIP, default "jax[cuda12]") and bertjax unless they are already importable.
# Rerun the same command to resume from the latest checkpoint in WORKDIR. Several GPU hosts: start this on each
# with `--coordinator HOST0:PORT --num-processes N --process-id I` after the key=value overrides.
set -euo pipefail
CALLER=$PWD
cd "$(dirname "$0")/.."  # the checkout: pip installs it from here
# shellcheck source=/dev/null  # launch/caller_paths.sh, linted on its own
. launch/caller_paths.sh
if [ $# -lt 2 ]; then
  echo "usage: $0 CONFIG WORKDIR [key=value ...]" >&2
  exit 2
fi
CONFIG=$(config_from_caller "$CALLER" "$1")
WORKDIR=$(from_caller "$CALLER" "$2")
shift 2
if ! python3 -c "import jax; assert jax.default_backend() == 'gpu'" 2>/dev/null; then
  python3 -m pip install -q -U "${JAX_PIP:-jax[cuda12]}"
fi
python3 -c "import bertjax" 2>/dev/null || python3 -m pip install -q -e .
# Let XLA overlap collectives with compute, and let JAX take most of the GPU memory up front.
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_latency_hiding_scheduler=true"
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
exec python3 -m bertjax pretrain --config "$CONFIG" --workdir "$WORKDIR" "$@"
