#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md, in stages that fit a short lease of a GPU machine without network.
#
#   launch/gpu_wheels.sh                             # first, on a machine with PyPI: wheels into .whl/
#   launch/gpu_session.sh env check attention        # then on the GPU machine, from the repository root
#   launch/gpu_session.sh train profile
#   launch/gpu_session.sh memory inference
#   launch/gpu_session.sh tune                       # if the lease has time left
#
# Stages (each prints a short table last and writes its whole log to $OUT/<stage>.log, or ./gpu-logs/):
#   env        GPU, driver and package versions; what JAX sees
#   check      tests/test_gpu_kernels.py (the Triton-compiled kernels against dense XLA: correctness first), and
#              the CUDA export tests, which compile for the real GPU here
#   attention  bench.attention_bench (pallas_gpu vs cuDNN and XLA, 512..16384) and bench.attention_bias_bench
#   tune       bench.attention_bench --tune: pallas_gpu tiles, warps and stages at 8192
#   train      bench.train_bench --gpu: modernbert-base step, rows of 1024, against transformers
#   profile    bench.profile_step: where the modernbert-base step's GPU time goes (attention, products, the rest)
#   memory     bench.train_bench --gpu-max-batch at 8192, bertjax then transformers (one process each)
#   inference  bench.embed_bench --gpu: the ModernBERT paper's Table 2 setting
# Budget: each call of the device tool runs at most 10 minutes, and a modernbert-base step compiles in tens of
# seconds, so each call above compiles at most about ten such programs. Every bench prints its rows as it goes,
# so a call cut off at its limit still brings back what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu  # cuda first: the default backend
# Carried wheels (launch/gpu_wheels.sh) go to /tmp/site, ahead of nothing the image already has.
if ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c "import grain, tensorboardX" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

run() {  # run STAGE COMMAND...: the command's output to the terminal and to $LOGS/STAGE.log
  local stage=$1
  shift
  echo "=== $stage: $* ($(date -u +%H:%M:%S))"
  "$@" 2>&1 | tee -a "$LOGS/$stage.log"
  local status=${PIPESTATUS[0]}
  [ "$status" -eq 0 ] || echo "=== $stage: exit status $status"
}

for stage in "$@"; do
  case $stage in
    env)
      run env nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
      run env python3 -c "
import importlib.metadata as m, jax
for name in ('jax', 'jaxlib', 'jax-cuda13-plugin', 'jax-cuda12-plugin', 'flax', 'optax', 'orbax-checkpoint',
             'chex', 'grain', 'transformers', 'sentence-transformers', 'torch', 'triton', 'numpy'):
    try: print(name, m.version(name))
    except m.PackageNotFoundError: print(name, 'not installed')
print(jax.devices(), jax.devices()[0].device_kind)
import bertjax; print('bertjax imports')"
      ;;
    check)
      # Lowering with a GPU present runs the real Triton compiler (JAX >= 0.11), so the export tests count too.
      run check python3 -m pytest -q -p no:cacheprovider tests/test_gpu_kernels.py tests/test_pallas_gpu_export.py \
        tests/test_deberta_pallas_gpu.py
      ;;
    attention)
      run attention python3 -m bench.attention_bench --seqs 512 2048 8192 16384 --max-gib 16 --min-seconds 0.5
      run attention python3 -m bench.attention_bias_bench --seqs 1024 4096 16384 --dtype bfloat16 --max-gib 16
      ;;
    tune)
      run tune python3 -m bench.attention_bench --tune --seqs 8192 --min-seconds 0.3
      ;;
    train)
      run train python3 -m bench.train_bench --gpu --gpu-batch 32 --attention auto xla
      ;;
    profile)
      run profile python3 -m bench.profile_step --preset modernbert-base --batch 16 --seq 1024
      ;;
    memory)
      run memory python3 -m bench.train_bench --gpu-max-batch bertjax --gpu-seq 8192 --start-batch 8
      run memory python3 -m bench.train_bench --gpu-max-batch transformers --gpu-seq 8192 --start-batch 8
      ;;
    inference)
      run inference python3 -m bench.embed_bench --gpu --json "$LOGS/inference.json"
      ;;
    *)
      echo "unknown stage '$stage' (env check attention tune train profile memory inference)" >&2
      exit 2
      ;;
  esac
done
