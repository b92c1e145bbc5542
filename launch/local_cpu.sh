#!/usr/bin/env bash
# Pretrain on this machine's CPU. Defaults to the tiny config (a few minutes on 2 cores, see README).
#
#   launch/local_cpu.sh [CONFIG] [WORKDIR] [key=value ...]
#   launch/local_cpu.sh configs/pretrain/tiny.yaml runs/tiny train.steps=200
#
# Rerun the same command to resume from the latest checkpoint in WORKDIR.
set -euo pipefail
CALLER=$PWD
cd "$(dirname "$0")/.."  # the checkout: pip installs it from here
# shellcheck source=/dev/null  # launch/caller_paths.sh, linted on its own
. launch/caller_paths.sh
CONFIG=configs/pretrain/tiny.yaml
WORKDIR=runs/tiny  # in the checkout, as the README's main job
if [ $# -ge 1 ]; then CONFIG=$(config_from_caller "$CALLER" "$1"); fi
if [ $# -ge 2 ]; then WORKDIR=$(from_caller "$CALLER" "$2"); fi
shift $(( $# < 2 ? $# : 2 ))
python3 -c "import bertjax" 2>/dev/null || python3 -m pip install -q -e .
# CPU only, even where an accelerator plugin is installed (JAX would otherwise probe for it at start-up).
export JAX_PLATFORMS=cpu
exec python3 -m bertjax pretrain --config "$CONFIG" --workdir "$WORKDIR" "$@"
