#!/usr/bin/env bash
# scripts/device-check.sh: everything a lent GPU is for, in one call (issue 48). A session gets 15 minutes of device
# time in all, the machine's start included, so this script is tested here first (--dry-run, in the default tests) and
# the device gets one run of it:
#
#   run(carry=[".deps"], timeout_s=570, command="scripts/device-check.sh")     there (scripts/device-build.sh fetch
#                                                                               here first fills .deps)
#   scripts/device-check.sh --dry-run [build-dir]                               here: the same steps on the CPU, tiny
#                                                                               sizes, the existing build
#
# Steps, in order, each under its own `timeout` (stated seconds, cut to what is left of BUDGET_S, default 500; a step
# with under 15 s left is skipped), each writing NAME.log, packed into $OUT/logs.tar.gz ($OUT: the device tool's;
# else out/device-check). Seconds each took on the first run (one H200, 16 cores; 485 s in all), against its limit:
#   env       the GPU, driver, torch, CPU                                                           11 s of 30
#   build     scripts/device-build.sh: build-cuda against the device's torch, only TARGETS below   226 s of 300
#   tests     the CUDA build's tests with DSCPP_TEST_DEVICE=cuda: engine, every ZeRO stage, offload, checkpoints,
#             activation checkpointing, NCCL on one rank, the device memory counter (TESTS below)    49 s of 150
#   engine    gpt-train --model gpt2, bf16, seq 1024, micro-batch 8: tokens/s, MFU of the chip's bf16 peak, phases
#                                                                                                  6 s of 120
#   loop      the plain PyTorch loop (bench/python_loop, fused AdamW) on the same model and data   15 s of 90
#   adam      bench_cpu_adam on the host's cores, then torch's AdamW on the GPU (bench/gpu_adam)    50 s of 90
#   offload   ZeRO-2 + offload_optimizer cpu on a 3.6B GPT (32 x 3072), three steps               121 s of the rest
# A step that fails or runs out of time is recorded and the next one runs; summary.txt (each step's status and
# seconds, then the figures) is rewritten after every step, so what finished comes back whatever happens later.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
# --run-step FUNCTION (after the build directory): how `step` runs one of this script's functions under `timeout`,
# which runs commands only: the script again, with the same settings, running just that function.
RUN_STEP=
if [ "${2:-}" = "--run-step" ]; then RUN_STEP=$3; fi
OUT=${OUT:-$ROOT/out/device-check}
mkdir -p "$OUT"
# The device tool brings back only a few files from $OUT, so the logs are written elsewhere (WORK) and $OUT holds two:
# summary.txt and logs.tar.gz, both rewritten after every step.
if [ -z "${DEVICE_CHECK_WORK:-}" ]; then
  DEVICE_CHECK_WORK=$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX")
  export DEVICE_CHECK_WORK  # the --run-step children write nothing there, but must not make their own
fi
WORK=$DEVICE_CHECK_WORK
mkdir -p "$WORK"
BUDGET_S=${BUDGET_S:-500}
START=$SECONDS
SUMMARY=$WORK/summary.txt
FIGURES=$WORK/figures.txt

# The tests a GPU changes: the device-parameterised engine, ZeRO, offload, checkpoint and activation suites, the
# device choice itself and NCCL (ctest names; the default set's, not the long one's).
TESTS='^(Engine|EngineStages|EnginePrecision|EngineTensors|EngineCheckpoint|ActivationCheckpointing|CheckpointedTraining|Stages/CheckpointedTraining|Stages/ZeroEquivalence|Offload/ZeroEquivalence|EveryStage/ExactResume|RankDevice|CommBackendFor|FlatAdam|FlatOptimizer|NcclOneRank|DeviceMemoryCounter)\.'
TARGETS=(gpt-train bench_cpu_adam test_engine test_device test_zero_equivalence test_checkpoint_engine
  test_checkpoint_process test_activation_checkpointing flat_optimizer_test nccl_one_rank_test test_device_memory)

if [ $DRY = 1 ]; then
  BUILD=$(realpath -m "${1:-$ROOT/build}")
  ARGS=(--dry-run "$BUILD")
  DEVICE=cpu
  PYTHON=$(sed -n 's/^DSCPP_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
  TESTS='^(RankDevice|NcclOneRank|DeviceMemoryCounter)\.'  # the ctest call itself, in seconds
  MODEL=(--model tiny --seq_len 64 --micro_batch 2)
  BIG=(--model tiny --seq_len 64 --micro_batch 1)
  STEPS=4
  ADAM_SIZES=(65536) ADAM_THREADS=(1) ADAM_REPEATS=1
else
  # The device's torch lives in a virtual environment that may not be on PATH.
  if ! python3 -c 'import torch' 2>/dev/null && [ -x /opt/torch/.venv/bin/python3 ]; then
    export PATH=/opt/torch/.venv/bin:$PATH
  fi
  # The Debian libraries scripts/device-build.sh unpacks (liburing, libaio, protobuf), for the binaries it builds.
  export LD_LIBRARY_PATH=$ROOT/.deps/root/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  BUILD=$ROOT/build-cuda
  ARGS=("$BUILD")
  DEVICE=cuda
  PYTHON=$(command -v python3)
  MODEL=(--model gpt2 --seq_len 1024 --micro_batch 8)
  # 3.6B parameters: fp32 master, moments and gradients (16 bytes each, ~58 GB) fit the 128 GB host with room for
  # the fp32 model built before the engine takes it; a 7B's ~112 GB do not leave that room.
  BIG=(--model gpt2 --n_layer 32 --n_embd 3072 --n_head 24 --seq_len 1024 --micro_batch 4 --activation_checkpointing)
  STEPS=20
  ADAM_SIZES=(16777216 268435456) ADAM_THREADS=(1 8 16) ADAM_REPEATS=3
fi

# summary.txt from steps.txt and figures.txt; rewritten after every step.
write_summary() {
  {
    echo "device-check $( [ $DRY = 1 ] && echo "(dry run, CPU)" ) $(date -u +%FT%TZ), commit ${DEVICE_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
    cat "$WORK/steps.txt"
    echo "figures:"
    cat "$FIGURES"
  } >"$SUMMARY"
  cp "$SUMMARY" "$OUT/summary.txt"
  tar -czf "$OUT/logs.tar.gz.part" -C "$WORK" . && mv "$OUT/logs.tar.gz.part" "$OUT/logs.tar.gz"
}

# step NAME SECONDS COMMAND...: runs COMMAND with stdout and stderr in NAME.log under the smaller of SECONDS and
# what is left of the budget; records ok / failed (exit status) / timed out / skipped and the seconds it took.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET_S - (SECONDS - START)))
  if [ "$left" -lt 15 ]; then
    printf '%-8s skipped (budget: %ds left)\n' "$name" "$left" >>"$WORK/steps.txt"
    write_summary
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local began=$SECONDS rc
  if declare -F "$1" >/dev/null; then set -- "$0" "${ARGS[@]}" --run-step "$1"; fi
  timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  local took=$((SECONDS - began)) status
  case $rc in
    0) status=ok ;;
    124 | 137) status="timed out after ${limit}s" ;;
    *) status="failed (exit $rc)" ;;
  esac
  printf '%-8s %-28s %4ds  (%s.log)\n' "$name" "$status" "$took" "$name" >>"$WORK/steps.txt"
  write_summary
  return $rc
}

# figure TEXT: one line of the figures section.
figure() {
  echo "$*" >>"$FIGURES"
  write_summary
}

# The median of a --metrics file's FIELD over the steps after the first two (warm-up: allocator, kernels' autotuning).
median_metric() {
  "$PYTHON" - "$1" "$2" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
values = [r[sys.argv[2]] for r in rows[2:] if r.get(sys.argv[2]) is not None]
print("%.1f" % statistics.median(values) if values else "n/a")
EOF
}

# The medians of a --metrics file's phases (wall_clock_s: forward, backward, optimizer step), in ms, after the
# warm-up steps: where a step's time goes. On a GPU the phase that first waits for the device (the step's gradient
# norm reads it back) also carries the kernels queued before it.
phases() {
  "$PYTHON" - "$1" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])][2:]
if rows and "wall_clock_s" in rows[0]:
    print(", ".join("%s %.1f ms" % (k, 1e3 * statistics.median(r["wall_clock_s"][k] for r in rows))
                    for k in ("fwd", "bwd", "step")))
EOF
}

# The GPU's memory in use, sampled every half second while a step runs (the peak is the step's GPU peak: the caching
# allocator's breakdown is not ours to read yet). No-op without nvidia-smi.
gpu_sampler_start() {
  command -v nvidia-smi >/dev/null || return 0
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 >"$WORK/$1.gpumem" 2>/dev/null &
  SAMPLER=$!
}
gpu_sampler_stop() {
  [ -n "${SAMPLER:-}" ] || return 0
  kill "$SAMPLER" 2>/dev/null
  wait "$SAMPLER" 2>/dev/null
  SAMPLER=
  echo "$(sort -n "$WORK/$1.gpumem" | tail -1) MiB"
}

# The steps that are functions of this script.
env_report() {
  command -v nvidia-smi >/dev/null && nvidia-smi
  "$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  lscpu | grep -E '^(Model name|CPU\(s\)|Flags)' | cut -c1-400
  grep -E "^(MemTotal|MemAvailable):" /proc/meminfo  # procps (free) may be missing
}
# A dry run's build is the README's: it must hold every target the device builds.
check_targets() {
  for t in "${TARGETS[@]}"; do
    find "$BUILD" -name "$t" -type f -perm -u+x | grep -q . || { echo "missing target $t in $BUILD"; return 1; }
  done
  echo "all ${#TARGETS[@]} targets present in $BUILD"
}
adam() {
  "$(find "$BUILD" -name bench_cpu_adam -type f | head -1)" --sizes "${ADAM_SIZES[@]}" --threads "${ADAM_THREADS[@]}" \
    --repeats "$ADAM_REPEATS" &&
    "$PYTHON" bench/gpu_adam/gpu_adam.py --device "$DEVICE" --sizes "${ADAM_SIZES[@]}" --repeats "$ADAM_REPEATS"
}
if [ -n "$RUN_STEP" ]; then
  "$RUN_STEP"
  exit
fi
: >"$WORK/steps.txt"
: >"$FIGURES"

PEAK=()  # --peak_tflops for the chip, set once the GPU's name is known (below)
# --- env -------------------------------------------------------------------------------------------------------------
step env 30 env_report
GPU=$(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
figure "gpu: ${GPU:-none}; cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
# The chip's dense bf16 peak for MFU (H100 / H200 SXM: 989 TFLOP/s); elsewhere gpt-train measures a matmul.
case "$GPU" in *H100* | *H200*) PEAK=(--peak_tflops 989) ;; esac

# --- build -----------------------------------------------------------------------------------------------------------
if [ $DRY = 1 ]; then
  step build 30 check_targets
else
  step build 300 scripts/device-build.sh build "$BUILD" "${TARGETS[@]}"
fi
[ -x "$BUILD/gpt-train" ] || { echo "device-check: no gpt-train in $BUILD; see build.log in $OUT/logs.tar.gz" >&2; exit 1; }

# --- tests -----------------------------------------------------------------------------------------------------------
# ctest keeps its logs under the directory it runs; a dry run runs inside the build's own ctest, so its ctest runs the
# build's tests from a directory of its own (a CTestTestfile naming the build) and leaves the outer run's logs alone.
TEST_DIR=$BUILD
if [ $DRY = 1 ]; then
  TEST_DIR=$WORK/ctest
  mkdir -p "$TEST_DIR" && echo "subdirs(\"$BUILD\")" >"$TEST_DIR/CTestTestfile.cmake"
fi
step tests 150 env DSCPP_TEST_DEVICE=$DEVICE ctest --test-dir "$TEST_DIR" -LE long -R "$TESTS" -j"$(nproc)" \
  --output-on-failure --timeout 120
figure "tests: $(grep -E 'tests passed|tests failed' "$WORK/tests.log" | tail -1)"
grep -E '^\s+[0-9]+ - ' "$WORK/tests.log" | sed 's/^\s*/  /' >>"$FIGURES"  # each failed or skipped test

# --- engine against the plain loop -----------------------------------------------------------------------------------
gpu_sampler_start engine
step engine 120 "$BUILD/gpt-train" --no_progress --device "$DEVICE" --bf16 "${MODEL[@]}" --steps "$STEPS" \
  "${PEAK[@]}" --metrics "$WORK/engine.jsonl"
ENGINE_GPU=$(gpu_sampler_stop engine)
gpu_sampler_start loop
step loop 90 "$PYTHON" bench/python_loop/gpt_loop.py --device "$DEVICE" --bf16 --fused "${MODEL[@]}" \
  --steps "$STEPS" --metrics "$WORK/loop.jsonl"
LOOP_GPU=$(gpu_sampler_stop loop)
if [ -s "$WORK/engine.jsonl" ]; then
  ENGINE_TPS=$(median_metric "$WORK/engine.jsonl" tokens_per_s)
  figure "engine: ${MODEL[*]} bf16: median $ENGINE_TPS tokens/s, step $(median_metric "$WORK/engine.jsonl" step_ms) ms," \
    "GPU peak ${ENGINE_GPU:-n/a}; $(grep -o 'MFU.*' "$WORK/engine.log" | head -1)"
  figure "engine phases: $(phases "$WORK/engine.jsonl")"
fi
if [ -s "$WORK/loop.jsonl" ]; then
  LOOP_TPS=$(median_metric "$WORK/loop.jsonl" tokens_per_s)
  figure "loop:   plain PyTorch, fused AdamW: median $LOOP_TPS tokens/s, step $(median_metric "$WORK/loop.jsonl" step_ms) ms," \
    "GPU peak ${LOOP_GPU:-n/a}"
  [ -n "${ENGINE_TPS:-}" ] && figure "engine / loop tokens/s: $("$PYTHON" -c "print(f'{$ENGINE_TPS / $LOOP_TPS:.3f}')") (target >= 1.0)"
fi

# --- Adam: the host's cores against torch, and the GPU's fused step --------------------------------------------------
step adam 90 adam
sed -n '/^ *params/,$p' "$WORK/adam.log" | sed 's/^/  /' >>"$FIGURES"

# --- ZeRO-Offload on the largest model ---------------------------------------------------------------------------------
cat >"$WORK/offload.json" <<'EOF'
{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true},
 "zero_optimization": {"stage": 2, "overlap_comm": true, "contiguous_gradients": true,
                       "offload_optimizer": {"device": "cpu"}},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.1}}}
EOF
gpu_sampler_start offload
step offload 400 "$BUILD/gpt-train" --no_progress --device "$DEVICE" "${BIG[@]}" --steps 3 "${PEAK[@]}" \
  --deepspeed_config "$WORK/offload.json" --metrics "$WORK/offload.jsonl"
OFFLOAD_GPU=$(gpu_sampler_stop offload)
if [ -s "$WORK/offload.jsonl" ]; then
  LAST=$(tail -1 "$WORK/offload.jsonl" | "$PYTHON" -c 'import json, sys
r = json.load(sys.stdin)
print("%.0f ms, %.0f tokens/s, host peak %.1f GiB" % (r["step_ms"], r["tokens_per_s"], r["peak_rss_bytes"] / 2**30))')
  figure "offload phases: $(phases "$WORK/offload.jsonl")"
  figure "offload: ${BIG[*]}, ZeRO-2 + offload_optimizer cpu: last step $LAST, GPU peak ${OFFLOAD_GPU:-n/a}; $(grep -E 'model states|MFU' "$WORK/offload.log" | tail -2 | tr '\n' ' ')"
fi
write_summary
cat "$SUMMARY"
# The check succeeds when all seven steps ran and passed.
[ "$(grep -cE '^[a-z]+ +ok ' "$WORK/steps.txt")" -eq 7 ]
