#!/usr/bin/env bash
# Pretrain on a Cloud TPU VM pod slice: create the slice (if it does not exist), install this checkout on every
# worker, and start the same command on all of them (`--worker=all`).
#
#   launch/tpu_pod.sh NAME ZONE ACCELERATOR_TYPE CONFIG CHECKPOINT_DIR [key=value ...]
#   launch/tpu_pod.sh bert-pod us-east5-a v5p-32 configs/pretrain/modernbert-base.yaml gs://my-bucket/modernbert
#
# The workers find each other from the TPU VM metadata (`bertjax pretrain` calls jax.distributed.initialize()
# when it runs on a TPU VM), so the command is identical everywhere. Checkpoints go to CHECKPOINT_DIR, which every
# worker must see (a GCS bucket); each worker keeps a local workdir (~/run) for its tokenizer copy, and worker 0
# writes metrics.jsonl, TensorBoard events and loss.png there. Each worker reads its own share of the data.
#
# Preemption: workers get SIGTERM, agree on a step, save a checkpoint and exit. Rerun this script with the same
# arguments to recreate the slice if needed and resume from the latest checkpoint.
#
# Environment: TPU_VERSION (runtime image, default v2-alpha-tpuv5 for v5p; v2-alpha-tpuv5-lite for v5e,
# tpu-ubuntu2204-base for v4), SPOT=1 for a spot slice, PROJECT for gcloud's --project.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 5 ]; then
  echo "usage: $0 NAME ZONE ACCELERATOR_TYPE CONFIG CHECKPOINT_DIR [key=value ...]" >&2
  exit 2
fi
NAME=$1 ZONE=$2 TYPE=$3 CONFIG=$4 CHECKPOINTS=$5
shift 5
GCLOUD=(gcloud compute tpus tpu-vm)
WHERE=(--zone "$ZONE" ${PROJECT:+--project "$PROJECT"})

if ! "${GCLOUD[@]}" describe "$NAME" "${WHERE[@]}" >/dev/null 2>&1; then
  "${GCLOUD[@]}" create "$NAME" "${WHERE[@]}" --accelerator-type "$TYPE" \
    --version "${TPU_VERSION:-v2-alpha-tpuv5}" ${SPOT:+--spot}
fi

# The committed tree of this checkout, installed with JAX for TPU on every worker.
ARCHIVE=$(mktemp -d)/bertjax.tar.gz
git archive --format=tar.gz -o "$ARCHIVE" HEAD
"${GCLOUD[@]}" scp "$ARCHIVE" "$NAME":bertjax.tar.gz "${WHERE[@]}" --worker=all
"${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --command \
  "rm -rf ~/bertjax && mkdir -p ~/bertjax && tar -xzf ~/bertjax.tar.gz -C ~/bertjax && \
   python3 -m pip install -q -U 'jax[tpu]' -e ~/bertjax"

# The same command on every worker; each keeps its log in ~/pretrain.log.
OVERRIDES=$(printf ' %q' "checkpoint.directory=$CHECKPOINTS" "$@")
"${GCLOUD[@]}" ssh "$NAME" "${WHERE[@]}" --worker=all --command \
  "cd ~/bertjax && python3 -m bertjax pretrain --config $(printf %q "$CONFIG") --workdir ~/run$OVERRIDES \
   2>&1 | tee ~/pretrain.log"
