#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md, sized for one lease of the device tool: 15 minutes of device time in
# all, the machine's start (1-2 minutes) included, at most 10 minutes per call, 30 s warm between calls, no network.
#
#   launch/gpu_wheels.sh                     # first, on a machine with PyPI: wheels into .whl/
#   launch/gpu_session.sh                    # call 1 (timeout_s 590, carry .whl): the main plan below, ~9.5 minutes
#   launch/gpu_session.sh inference:100 atomic:90 tune:70  # call 2, at once while warm, with what is left (~260 s)
#   launch/gpu_session.sh --dry-run [STAGE[:SECONDS] ...]   # anywhere: print the plan and its time caps
#
# Each STAGE may carry a time cap in seconds (STAGE:SECONDS; default: CAP below). At its cap a stage gets SIGINT,
# and SIGKILL 5 s later (a process can hang at exit behind a computation in flight): the timing benches print
# their rows as they measure them and, interrupted, their summary of what they have (the profile prints only at
# its end), so a slow stage costs the stages after it nothing but those seconds. The whole script also ends by
# GPU_SESSION_DEADLINE seconds from its start (default 580: call 1's timeout_s is 590, and the wheels' install and
# import check come out of it too): each stage is capped at what is left before it, less the 5 s a kill may take,
# and a stage left less than its MIN_CAP is skipped, said in the summary the script ends with. Stages, in the
# order of the main plan:
#   env        GPU, driver and package versions; what JAX sees
#   check      tests/test_gpu_kernels.py: the Triton-compiled kernels (attention split and stacked, DeBERTa's,
#              the norm, the GLU) against XLA at model sizes, first: four kernel paths are new since the second
#              lease (the export tests compile the same kernels for sm_90 in CI); -v, so a capped run still names
#              each test that passed
#   norm       bench.norm_bench --tune: the residual add + norm kernel (pallas_gpu_norm) against XLA's fusions at
#              the train step's shape, and its block_rows x num_warps
#   train_kernels  bench.train_bench --gpu: the modernbert-base step (32 rows of 1024) with everything new
#              (attention on the stacked q/k/v, the norm kernel, the GLU kernel) against everything as it was,
#              then each alone, then the pairs; transformers right after the first case, on the same card in the
#              same run (the issue's side by side; the second lease's 200.2 ms was an H100's).
#              Deviceless counts: the norm kernel 8.5 GB a step less, the stacked q/k/v 7.0 GB less, the GLU
#              kernel 3.3 GB less; all rows include the dq kernel's delta (1.1 GB less; the step was 76.2 ms
#              before it) and the dk/dv kernel's transposed tiles
#   memory     bench.train_bench --gpu-max-batch at 8192: transformers, then bertjax, each from its H100 answer (9;
#              24, the deviceless compile's answer being 25) scaled by this card's memory against the H100's
#              (--start-batch auto: ~16 and ~42 on an H200), JAX preallocating one region of 95% of the card
# and, in call 2:
#   inference  bench.embed_bench --gpu: the ModernBERT paper's Table 2 setting at 512, bert-base first (never
#              measured), then modernbert-base's variable lengths; 8192 after them (measured on the second lease)
#   train      bench.train_bench --gpu: modernbert-base step, rows of 1024, bertjax then transformers
#   attention  bench.attention_bench: pallas_gpu against cuDNN (and dense XLA), 16384 first (the one length whose
#              forward+backward missed 0.7x cuDNN on the second lease), then 8192, 512, 2048; with JAX's own
#              Mosaic GPU FlashAttention (float16, global layers only) as the mark for a Hopper port
#   atomic     the one-pass backward (pallas_gpu_atomic: dq, dk and dv in one Triton kernel, dq added with relaxed
#              atomics; 5 tile products a tile where the two kernels take 7): one kernel case on the card, then
#              forward+backward beside the two-kernel backward and cuDNN at 16384 and 1024, then its tiles at 16384;
#              compiled here without a GPU, never timed (bench.pallas_gpu_static --backward-kernel triton_atomic:
#              551 PTX instructions a fully visible tile against dq's 319 and dk/dv's 457)
#   train_atomic (for a lease with time left) the modernbert-base step with the one-pass backward against the two
#              kernels, the other new kernels on in both
#   mosaic     (for a lease with time left) bench.attention_bench: bertjax's Mosaic GPU kernels (pallas_gpu_mosaic:
#              TMA + wgmma forward, dq and dk/dv) against pallas_gpu's Triton ones and cuDNN at 16384 and 1024;
#              compiled here without a GPU, never timed (bench.mosaic_gpu_static: 257 PTX instructions a fully visible forward tile, Triton's 325)
#   profile    bench.profile_step: where the modernbert-base step's GPU time goes (trace and HLO copied to $OUT)
#   tune       bench.attention_bench --tune: pallas_gpu's tiles, warps and stages at 16384 (global), where
#              forward+backward is 0.68x cuDNN (0.7x wanted): the dq kernel's, then the dk/dv kernel's (each its own
#              since this lease: dq holding 128 queries and dk/dv 128 keys is now one setting), the backward with the
#              fastest of both and forward+backward against cuDNN's, then the forward's (8192 was swept on both
#              leases) and forward+backward against cuDNN's again
#   tune_mosaic the Mosaic GPU kernels' sweep (streamed rows 64 or 128, 2 to 4 stages each) at 16384, global, for
#              a lease with time left after the mosaic stage
#   tune_wide  the same sweep at head_dim 128 (eurobert-2.1b's heads; 16 of them at 4096), whose defaults put 8 warps
#              on 64-row tiles: each tile's scores computed twice (docs/benchmarks.md); not a target, for a lease
#              with time left
#   tune_train the same sweep at the train step's attention shape (32 rows of 1024, 4 documents each), local layers
#              first: the step's 22 attention layers took 11.1 ms of its 76.2. There a query tile visits 3 key tiles
#              (local) or 4 (global, its 256-token document), so each program is short and its fixed work (loading
#              q, writing o) weighs more than at 8192, whose sweeps need not carry over
# The first lease (H100, 2026-11-26, docs/benchmarks.md) ran the old order (env check train attention inference
# memory, then profile and tune) and ran out of time in check (2 of 6 kernel cases in 75 s), train (transformers not
# reached in 150 s), inference (3 of 8 rows in 110 s) and memory. The second lease (2026-11-27) ran env train memory
# inference check (551 s), then attention:100 profile:60 tune:90 (203 s): train took ~180 s (both frameworks and the
# one-document rows), each bertjax memory try ~50 s (a compile each), inference ~80 s at 8192 and ~25 s a setting at
# 512, check 3 of its 8 tests in 70 s on 4 workers, attention 81 s, profile 28 s. What that lease measured (training
# against transformers, attention) left the main plan, which is what it did not finish and the new kernels.
# Each stage writes $OUT/<stage>.log (or ./gpu-logs/); the inference stage also inference.json: at most 8 files
# come back from a call.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

declare -A CAP=([env]=20 [check]=100 [norm]=40 [train_kernels]=180 [train]=190 [attention]=60 [inference]=130
                [memory]=220 [tune]=130 [tune_train]=140 [tune_wide]=120 [profile]=50 [mosaic]=100
                [tune_mosaic]=90 [atomic]=90
                [train_atomic]=120)
# The least a stage is run with when the deadline leaves it less than its cap: one compile and a measurement (a
# memory try of bertjax's compiles for ~50 s after transformers' share; a pytest case, ~25 s after pytest's start).
declare -A MIN_CAP=([env]=10 [check]=45 [norm]=20 [train_kernels]=60 [train]=60 [attention]=30 [inference]=40
                    [memory]=90 [tune]=40 [tune_train]=40 [tune_wide]=40 [profile]=40 [mosaic]=50
                    [tune_mosaic]=40 [atomic]=50 [train_atomic]=60)
MAIN_PLAN=(env check norm train_kernels memory)  # caps sum to 560 s, under the 580 s deadline of call 1
KILL_AFTER=5  # seconds from a cap's SIGINT to SIGKILL
MARGIN=3      # seconds kept after a killed command for tee, the summary and exit
DEADLINE=${GPU_SESSION_DEADLINE:-580}
[[ "$DEADLINE" =~ ^[0-9]+$ ]] || { echo "GPU_SESSION_DEADLINE must be whole seconds, not '$DEADLINE'" >&2; exit 2; }

DRY_RUN=0
if [ "${1:-}" = "--dry-run" ]; then
  DRY_RUN=1
  shift
fi
STAGES=("$@")
[ ${#STAGES[@]} -gt 0 ] || STAGES=("${MAIN_PLAN[@]}")

LOGS=${OUT:-gpu-logs}
if [ "$DRY_RUN" -eq 0 ]; then
  mkdir -p "$LOGS"
  export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cuda,cpu  # cuda first: the default backend
  # A second call on the still-warm machine reuses the first call's compiled programs.
  export JAX_COMPILATION_CACHE_DIR=/tmp/bertjax-jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=2
  # Carried wheels (launch/gpu_wheels.sh) go to /tmp/site, ahead of nothing the image already has.
  if ls .whl/*.whl >/dev/null 2>&1 && ! python3 -c "import grain, tensorboardX" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  # The image's own Flax/Optax/Orbax/chex are used when bertjax imports with them; otherwise the versions the
  # deviceless H100 compiles were checked with (launch/gpu_wheels.sh puts them in .whl/fallback) go first.
  if ! python3 -c "import bertjax.train.setup, bertjax.models" 2>"$LOGS/import.log" \
      && ls .whl/fallback/*.whl >/dev/null 2>&1; then
    echo "=== bertjax does not import with the image's packages ($(tail -1 "$LOGS/import.log")): carried ones"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-fallback \
      .whl/fallback/*.whl || exit 1
    export PYTHONPATH="$PWD:/tmp/site-fallback:${PYTHONPATH#"$PWD:"}"
  fi
fi

STAGE_STARTED=$SECONDS
STAGE_NOTES=""
SUMMARY=()
command_name() {  # the module a command runs (python3 -m NAME), else its program: the summary's name for it
  local previous=""
  for arg in "$@"; do
    [ "$previous" = "-m" ] && { echo "$arg"; return; }
    previous=$arg
  done
  echo "$1"
}
deadline_room() {  # seconds a command starting now may be given, its kill included, before the deadline
  echo $((DEADLINE - SECONDS - KILL_AFTER - MARGIN))
}
run() {  # run STAGE CAP COMMAND...: the command's output to the terminal and to $LOGS/STAGE.log, within CAP
  local stage=$1 cap=$2  # CAP counts from the stage's start: the commands of a stage share it
  shift 2
  local left=$((cap - (SECONDS - STAGE_STARTED)))
  local room
  room=$(deadline_room)
  [ "$room" -lt "$left" ] && left=$room
  if [ "$DRY_RUN" -eq 1 ]; then
    printf '  [%s, cap %ss]' "$stage" "$cap"
    printf ' %q' "$@"
    echo
    return 0
  fi
  if [ "$left" -le 5 ]; then
    echo "=== $stage: no time left under its ${cap}s cap or the ${DEADLINE}s deadline for: $*"
    STAGE_NOTES+="; no time left for $(command_name "$@")"
    return 0
  fi
  echo "=== $stage: $* ($(date -u +%H:%M:%S), ${left}s left)"
  local began=$SECONDS
  timeout --signal=INT --kill-after="$KILL_AFTER" "$left" "$@" 2>&1 | tee -a "$LOGS/$stage.log"
  local status=${PIPESTATUS[0]}
  # The caps are estimates made before any GPU run: these lines are what to size the next plan by.
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "=== $stage: stopped after ${left}s (its ${cap}s cap, or the deadline)"
    STAGE_NOTES+="; $(command_name "$@") stopped after ${left}s"
  elif [ "$status" -ne 0 ]; then
    echo "=== $stage: exit status $status"
    STAGE_NOTES+="; $(command_name "$@") exit status $status"
  fi
  echo "=== $stage: $((SECONDS - began))s"
}

total=0
planned=0  # --dry-run: where the clock would stand if every stage before ran to its cap and took its kill's seconds
[ "$DRY_RUN" -eq 1 ] && echo "# deadline ${DEADLINE}s from the script's start (GPU_SESSION_DEADLINE); a stage gets \
its cap or what is left before the deadline less ${KILL_AFTER}s + ${MARGIN}s, counted here as if every stage before \
ran to its cap (the wheels' install before the first is not counted)"
for item in "${STAGES[@]}"; do
  stage=${item%%:*}
  cap=${CAP[$stage]:-}
  if [ -z "$cap" ]; then
    echo "unknown stage '$stage' (${!CAP[*]})" >&2
    exit 2
  fi
  if [ "$item" != "$stage" ]; then
    cap=${item#*:}
    [[ "$cap" =~ ^[0-9]+$ ]] || { echo "stage '$item': the cap after ':' must be whole seconds" >&2; exit 2; }
  fi
  [ "$DRY_RUN" -eq 1 ] && SECONDS=$planned  # the dry run's clock: run() and deadline_room() read it
  room=$(deadline_room)
  least=${MIN_CAP[$stage]}
  [ "$cap" -lt "$least" ] && least=$cap  # a cap asked below the minimum is the caller's choice
  if [ "$room" -lt "$least" ]; then
    line="$stage: skipped: $((room > 0 ? room : 0))s left before the ${DEADLINE}s deadline, it needs ${least}s"
    echo "=== $line"
    SUMMARY+=("$line")
    continue
  fi
  [ "$room" -lt "$cap" ] && cap=$room
  total=$((total + cap))
  planned=$((planned + cap + KILL_AFTER))
  STAGE_STARTED=$SECONDS
  STAGE_NOTES=""
  case $stage in
    env)
      run env "$cap" nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
      run env "$cap" python3 -m bench.gpu_env
      ;;
    check)
      # Four workers: the cases' time is Triton and XLA compiling on the CPU (2 of 6 cases in 75 s on one worker,
      # first lease), and the card holds them all when none preallocates. The one-pass backward's and the Mosaic GPU
      # kernels' cases are the atomic and mosaic stages' (one case each, before they time them): here they would take
      # time from the kernels call 1 times.
      run check "$cap" env XLA_PYTHON_CLIENT_PREALLOCATE=false python3 -m pytest -v -p no:cacheprovider -n 4 \
        tests/test_gpu_kernels.py -k "not pallas_gpu_mosaic and not pallas_gpu_atomic"
      ;;
    train)
      run train "$cap" python3 -m bench.train_bench --gpu --gpu-batch 32 --attention auto --steps 10
      ;;
    norm)
      run norm "$cap" python3 -m bench.norm_bench --tune
      ;;
    train_kernels)
      # Everything new on packed rows first, then transformers on the same card (the issue's side by side in one
      # run), then the other combinations (everything as it was, then each alone), then one document per row (the
      # like-for-like rows against transformers'), if the cap leaves time.
      run train_kernels "$cap" python3 -m bench.train_bench --gpu --gpu-batch 32 --attention auto \
        --fused-qkv on off --norm pallas_gpu xla --glu pallas_gpu xla --steps 10
      ;;
    attention)
      run attention "$cap" python3 -m bench.attention_bench --seqs 16384 8192 512 2048 \
        --implementations pallas_gpu cudnn xla mosaic_gpu_f16 --max-gib 8 --repeats 3 --min-seconds 0.1
      ;;
    inference)
      run inference "$cap" python3 -m bench.embed_bench --gpu --models bert-base modernbert-base --lengths 512 8192 \
        --texts 4096 --long-texts 128 --json "$LOGS/inference.json"
      ;;
    memory)
      # Each framework in its own process: neither hands its freed memory back to the other.
      # transformers tries run eagerly (seconds each; 9 fit, 10 did not on the second lease's H100); bertjax's
      # compile (~50 s a try), so it gets the larger share. Each starts from its H100 answer scaled by the card's
      # memory (--start-batch auto): from the H100's own answers an H200 (~1.76x the memory) is 8-10 bertjax tries
      # away, more than the cap holds.
      run memory $((cap / 5)) python3 -m bench.train_bench --gpu-max-batch transformers --gpu-seq 8192 \
        --start-batch auto --near
      # 24: the deviceless compile, with the card's cuBLAS products (bertjax/gpu_aot.py), puts the largest batch at 25
      # (68.9 GiB at 24, 73.1 at 25, 77.5 at 26). On the second lease the card's compile asked for 69.8 GiB of
      # temporaries at 24 and at 23 (its rematerialisation aims at 95% of JAX's
      # 75.2 GiB), which failed to allocate, most likely for want of one region that large: JAX had not preallocated
      # (bench/train_bench.py now does, and prints what each try needs against what the card holds).
      # Stepping 1, 2, 4, ... from 24 x this card's JAX memory limit / 75.2 GiB.
      run memory "$cap" python3 -m bench.train_bench --gpu-max-batch bertjax --gpu-seq 8192 --start-batch auto \
        --near
      ;;
    atomic)
      # The one-pass backward (pallas_gpu_atomic: dq by relaxed atomics, 5 tile products where the two kernels take
      # 7; never run on a GPU) against dense attention on the card first (one case: each compiles for ~25 s), then
      # forward+backward beside the two-kernel backward and cuDNN at 16384 (0.68x cuDNN's speed on the second
      # lease) and the train step's 1024 (global and local 128), then its tiles at 16384 against cuDNN if the cap
      # leaves time. The case needs pytest's start and its compile (~25 s): at least 50 s, a third of a larger cap.
      first=$((cap / 3 > 50 ? cap / 3 : 50))
      run atomic $((first < cap ? first : cap)) python3 -m pytest -v -p no:cacheprovider tests/test_gpu_kernels.py \
        -k "pallas_gpu_atomic and global_bf16"
      run atomic $((cap * 9 / 10)) python3 -m bench.attention_bench --seqs 16384 1024 --implementations \
        pallas_gpu_atomic pallas_gpu cudnn --passes forward+backward --max-gib 8 --repeats 3 --min-seconds 0.1 \
        --packed-docs 0
      run atomic "$cap" python3 -m bench.attention_bench --tune --seqs 16384 --tune-layers global \
        --tune-passes atomic --repeats 3 --min-seconds 0.1
      ;;
    train_atomic)
      # The modernbert-base step with the one-pass backward against the two kernels, every other new kernel on in
      # both rows: fewer products, but XLA passes around it (delta, zeroing dq's float32 sum, storing it) that the
      # deviceless count puts at 2-4 GB a step more traffic (docs/benchmarks.md).
      run train_atomic "$cap" python3 -m bench.train_bench --gpu --gpu-batch 32 --attention pallas_gpu_atomic auto \
        --fused-qkv on --norm pallas_gpu --glu pallas_gpu --no-transformers --steps 10
      ;;
    mosaic)
      # The Mosaic GPU kernels (pallas_gpu_mosaic, never run on a GPU) first against dense attention on the card
      # (one case of tests/test_gpu_kernels.py: a timing of a kernel that fails it is not a result), then beside the
      # Triton ones and cuDNN: global, local 128 and packed rows at 16384 and the train step's 1024.
      first=$((cap * 2 / 5 > 50 ? cap * 2 / 5 : 50))  # pytest's start and a compile, as atomic's
      run mosaic $((first < cap ? first : cap)) python3 -m pytest -v -p no:cacheprovider tests/test_gpu_kernels.py \
        -k "pallas_gpu_mosaic and global_bf16"
      run mosaic "$cap" python3 -m bench.attention_bench --seqs 16384 1024 --implementations pallas_gpu_mosaic \
        pallas_gpu cudnn --max-gib 8 --repeats 3 --min-seconds 0.1
      ;;
    tune)
      # ~38 timings before the first cuDNN comparison (each a compile and 3 x 0.1 s), the forward's 18 after
      run tune "$cap" python3 -m bench.attention_bench --tune --seqs 16384 --tune-layers global \
        --tune-passes dq dkv forward --repeats 3 --min-seconds 0.1
      ;;
    tune_mosaic)
      run tune_mosaic "$cap" python3 -m bench.attention_bench --tune --tune-kernels mosaic --seqs 16384 \
        --tune-layers global --tune-passes forward dq dkv --repeats 3 --min-seconds 0.1
      ;;
    tune_wide)
      run tune_wide "$cap" python3 -m bench.attention_bench --tune --seqs 4096 --heads 16 --head-dim 128 \
        --tune-layers global --tune-passes forward dq dkv --repeats 3 --min-seconds 0.1
      ;;
    tune_train)
      run tune_train "$cap" python3 -m bench.attention_bench --tune --seqs 1024 --batch 32 --tune-docs 4 \
        --tune-layers local global --tune-passes dq dkv forward --repeats 3 --min-seconds 0.1
      ;;
    profile)
      run profile "$cap" python3 -m bench.profile_step --preset modernbert-base --batch 32 --seq 1024 \
        --copy-to "$LOGS"
      ;;
  esac
  SUMMARY+=("$stage: $((SECONDS - STAGE_STARTED))s of a ${cap}s cap${STAGE_NOTES}")
done
if [ "$DRY_RUN" -eq 1 ]; then
  echo "# caps sum to ${total}s"
else
  echo "=== summary (${SECONDS}s of the ${DEADLINE}s deadline)"
  printf '  %s\n' "${SUMMARY[@]}"
fi
exit 0
