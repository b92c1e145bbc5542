#!/usr/bin/env bash
# Pretrain on a Cloud TPU VM pod slice: create the slice (if it does not exist), install this checkout on every
# worker, and start the same command on all of them (`--worker=all`), detached from this SSH session.
#
#   launch/tpu_pod.sh [--dry-run] [--follow] NAME ZONE ACCELERATOR_TYPE CONFIG CHECKPOINT_DIR [key=value ...]
#   launch/tpu_pod.sh --follow bert-pod us-east5-a v5p-32 configs/pretrain/modernbert-base.yaml gs://my-bucket/mb
#
# --dry-run (or DRY_RUN=1) prints the gcloud commands instead of running them; --follow (or FOLLOW=1) follows
# worker 0's log once the run has started (Ctrl-C then stops only the following, never the run).
#
# What reaches the workers: the committed tree of this checkout (`git archive HEAD`: uncommitted edits and
# untracked files do not), and CONFIG as it is here, committed or not, inside this checkout or not: it is copied
# to ~/pretrain-config.yaml on every worker and the run reads that copy. Paths named inside CONFIG
# (tokenizer.path, data files) are read on the workers, relative to ~/bertjax (the archive).
#
# Python: bertjax needs Python >= 3.11, and the TPU runtime images are Ubuntu 22.04, whose python3 is 3.10. Each
# worker therefore gets uv (with the image's python3: `pip install --user uv`, else uv's installer), a standalone
# CPython PYTHON_VERSION (default 3.11) that uv downloads (TPU VMs reach the internet), and the virtual environment
# ~/bertjax-venv holding JAX for TPU (`jax[tpu]` of JAX_VERSION, libtpu included) and bertjax; the run starts from
# that venv. This works whatever python3 an image ships and leaves the system Python alone, where a version check
# could only refuse. A rerun from this machine, and a slice recreated after a preemption, installs the same JAX.
#
# The workers find each other from the TPU VM metadata (`bertjax pretrain` calls jax.distributed.initialize()
# when it runs on a TPU VM), so the command is identical everywhere. Checkpoints go to CHECKPOINT_DIR, which every
# worker must see (a GCS bucket); each worker keeps a local workdir (~/run) for its tokenizer copy, and worker 0
# writes metrics.jsonl, TensorBoard events and loss.png there. Each worker reads its own share of the data.
#
# The run outlives this script's SSH sessions (a closed laptop or a dropped connection does not stop a multi-day
# run): each worker starts it with `nohup setsid`, appends its output to ~/pretrain.log and keeps its pid in
# ~/pretrain.pid. The script ends by printing how to follow worker 0's log and how to stop the run: SIGTERM to
# the run on every worker, after which the workers agree on a step, save a checkpoint there and exit.
#
# Preemption: workers get SIGTERM and do the same. Rerun this script with the same arguments to resume from the
# latest checkpoint: it creates the slice again if it is gone, or deletes and recreates it if it is PREEMPTED (a
# spot slice), and refuses while a run is still going on.
#
# Environment:
#   TPU_VERSION  runtime image; by default the one Google documents for the accelerator type:
#                v5p-* v2-alpha-tpuv5, v5litepod-*/v5e-* v2-alpha-tpuv5-lite, v6e-* v2-alpha-tpuv6e,
#                v2-*/v3-*/v4-* tpu-ubuntu2204-base (https://cloud.google.com/tpu/docs/runtimes)
#   SPOT         1/true/yes: a spot slice; 0/false/no or unset: an on-demand one
#   PROJECT      gcloud's --project
#   PYTHON_VERSION  the workers' Python (default 3.11; bertjax needs >= 3.11)
#   JAX_VERSION  the workers' JAX (default: this machine's, the one `bertjax compile-check` compiled with here; all
#                for the newest). Pinned, a slice recreated after a preemption (a fresh venv) resumes on the same JAX.
set -euo pipefail
ORIGIN=$PWD
cd "$(dirname "$0")/.."

usage() {
  echo "usage: $0 [--dry-run] [--follow] NAME ZONE ACCELERATOR_TYPE CONFIG CHECKPOINT_DIR [key=value ...]" >&2
  echo "(the comment at the top of $0 says what it installs and how to follow and stop the run)" >&2
  exit 2
}
fail() {
  echo "$0: $*" >&2
  exit 2
}
truthy() {  # 1/true/yes (any case) -> 0; 0/false/no or empty -> 1; anything else is an error
  case $(printf %s "$2" | tr '[:upper:]' '[:lower:]') in
    1|true|yes|on) return 0 ;;
    0|false|no|off|"") return 1 ;;
    *) fail "$1=$2: use 1/true/yes or 0/false/no" ;;
  esac
}

DRY_RUN=${DRY_RUN:-0} FOLLOW=${FOLLOW:-0}
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY_RUN=1 ;;
    --follow) FOLLOW=1 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "$0: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
  shift
done
[ $# -ge 5 ] || usage
NAME=$1 ZONE=$2 TYPE=$3 CONFIG=$4 CHECKPOINTS=$5
shift 5
truthy DRY_RUN "$DRY_RUN" && DRY=true || DRY=false

# CONFIG relative to where the script was called from, else to this checkout (as before).
GIVEN_CONFIG=$CONFIG
case $CONFIG in
  /*) ;;
  *) if [ -f "$ORIGIN/$CONFIG" ]; then CONFIG=$ORIGIN/$CONFIG; fi ;;
esac
[ -f "$CONFIG" ] || fail "CONFIG $GIVEN_CONFIG is not a file"

default_version() {
  case $1 in
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-*|v5e-*) echo v2-alpha-tpuv5-lite ;;
    v6e-*) echo v2-alpha-tpuv6e ;;
    v2-*|v3-*|v4-*) echo tpu-ubuntu2204-base ;;
    *) return 1 ;;
  esac
}
if [ -z "${TPU_VERSION:-}" ]; then
  TPU_VERSION=$(default_version "$TYPE") || fail "no default runtime image for accelerator type $TYPE: set TPU_VERSION"
fi
SPOT_FLAG=""
if truthy SPOT "${SPOT:-}"; then SPOT_FLAG=--spot; fi
PYTHON_VERSION=${PYTHON_VERSION:-3.11}
if [ -z "${JAX_VERSION:-}" ]; then
  JAX_VERSION=$(python3 -c 'import jax; print(jax.__version__)' 2>/dev/null) || JAX_VERSION=all
fi
if [ "$JAX_VERSION" = all ]; then JAX_REQUIREMENT='jax[tpu]'; else JAX_REQUIREMENT="jax[tpu]==$JAX_VERSION"; fi

GCLOUD=(gcloud compute tpus tpu-vm)
WHERE=(--zone "$ZONE" ${PROJECT:+--project "$PROJECT"})

show() {  # a command as one line that a shell reads back as the same words
  local line="+" word
  for word in "$@"; do
    if [[ $word =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then line+=" $word"; else line+=" '${word//\'/\'\\\'\'}'"; fi
  done
  printf '%s\n' "$line"
}
run() {
  if $DRY; then show "$@"; else "$@"; fi
}

# The slice: created when missing; a preempted (spot) slice cannot restart and is deleted and created again.
CREATE=("${GCLOUD[@]}" create "$NAME" "${WHERE[@]}" --accelerator-type "$TYPE" --version "$TPU_VERSION"
        ${SPOT_FLAG:+"$SPOT_FLAG"})
if $DRY; then
  echo "# runtime image $TPU_VERSION; created only if the slice does not exist (or deleted first if PREEMPTED):"
  show "${CREATE[@]}"
else
  STATE=$("${GCLOUD[@]}" describe "$NAME" "${WHERE[@]}" --format='value(state)' 2>/dev/null || true)
  case $STATE in
    "") "${CREATE[@]}" ;;
    READY) ;;
    PREEMPTED)
      echo "$NAME was preempted: deleting it and creating it again" >&2
      "${GCLOUD[@]}" delete "$NAME" "${WHERE[@]}" --quiet
      "${CREATE[@]}" ;;
    *) fail "$NAME is $STATE, not READY: wait for it, or start or delete it" ;;
  esac
fi

# The committed tree of this checkout and the config file, on every worker.
if ! git diff --quiet HEAD --; then
  echo "note: uncommitted changes in this checkout do not reach the workers (git archive HEAD)" >&2
fi
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
run git archive --format=tar.gz -o "$STAGE/bertjax.tar.gz" HEAD
run "${GCLOUD[@]}" scp "$STAGE/bertjax.tar.gz" "$NAME":bertjax.tar.gz "${WHERE[@]}" --worker=all
run "${GCLOUD[@]}" scp "$CONFIG" "$NAME":pretrain-config.yaml.new "${WHERE[@]}" --worker=all

# On every worker: refuse while a run is going on (its files would be replaced under it), unpack, and install
# into ~/bertjax-venv with a Python uv provides (see the top of this file).
INSTALL="PYTHON_VERSION=$(printf %q "$PYTHON_VERSION")"$'\n'
INSTALL+="JAX_REQUIREMENT=$(printf %q "$JAX_REQUIREMENT")"$'\n'
INSTALL+=$(cat <<'EOF'
set -e
if [ -f ~/pretrain.pid ] && pid=$(cat ~/pretrain.pid) && kill -0 "$pid" 2>/dev/null &&
   grep -qa bertjax "/proc/$pid/cmdline"; then
  echo "$(hostname): a bertjax run is still going on (pid $pid); stop it first (kill -TERM $pid saves and exits)" >&2
  exit 1
fi
mv ~/pretrain-config.yaml.new ~/pretrain-config.yaml
rm -rf ~/bertjax && mkdir -p ~/bertjax && tar -xzf ~/bertjax.tar.gz -C ~/bertjax
export PATH="$HOME/.local/bin:$PATH"
if ! command -v uv >/dev/null; then
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --user uv || curl -LsSf https://astral.sh/uv/install.sh | sh
fi
[ -x ~/bertjax-venv/bin/python ] || uv venv -q --python "$PYTHON_VERSION" ~/bertjax-venv
uv pip install -q --python ~/bertjax-venv/bin/python "$JAX_REQUIREMENT" -e "$HOME/bertjax[gcs]"  # gcs: gs:// paths
echo "$(hostname): $(~/bertjax-venv/bin/python -c 'import sys, jax; print("Python", sys.version.split()[0], "JAX", jax.__version__)')"
EOF
)
run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --command "$INSTALL"

# The same command on every worker, detached: `nohup setsid` keeps it running when this SSH session ends. The
# check after it catches a run that ends at once (a config error), not later failures: follow the log for those.
START=$(cat <<'EOF'
cd ~/bertjax
echo "=== $(date -u '+%F %T') UTC: bertjax pretrain ===" >> ~/pretrain.log
nohup setsid bash -c 'echo $$ > ~/pretrain.pid && exec "$@"' pretrain \
  ~/bertjax-venv/bin/python -m bertjax pretrain --config ~/pretrain-config.yaml --workdir ~/run
EOF
)
ARGS=$(printf ' %q' "checkpoint.directory=$CHECKPOINTS" "$@")
START+="$ARGS >> ~/pretrain.log 2>&1 < /dev/null &"$'\n'
START+=$(cat <<'EOF'
sleep 20
if ! kill -0 "$(cat ~/pretrain.pid)" 2>/dev/null; then
  echo "$(hostname): the run ended within 20 s; the end of ~/pretrain.log:" >&2
  tail -n 30 ~/pretrain.log >&2
  exit 1
fi
echo "$(hostname): running as pid $(cat ~/pretrain.pid), output in ~/pretrain.log"
EOF
)
run "${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --command "$START"

FOLLOW_CMD=("${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=0 --command 'tail -n 50 -F ~/pretrain.log')
# shellcheck disable=SC2016  # $(...) runs on the workers
STOP_CMD=("${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --command 'kill -TERM "$(cat ~/pretrain.pid)"')
echo
echo "The run goes on without this session. Follow worker 0's log (Ctrl-C stops only the following):"
show "${FOLLOW_CMD[@]}"
echo "Stop it cleanly: every worker saves a checkpoint at the same step and exits (rerun this script to resume):"
show "${STOP_CMD[@]}"
if truthy FOLLOW "$FOLLOW"; then
  run "${FOLLOW_CMD[@]}"
fi
