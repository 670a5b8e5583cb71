#!/usr/bin/env bash
# bench/python_baseline: gpt-train on one process (the whole machine: OMP_NUM_THREADS = the core count) at ZeRO stages
# 0-3 against a plain PyTorch loop (bench/python_loop: Debian's python3-torch on the same LibTorch, the same GPT,
# weights, data and AdamW(foreach)) in its own process, interleaved over ROUNDS rounds (bench/common.sh). Each is a
# whole process with its own allocator, so start-up policy (dscpp/engine/host_malloc.h) counts here, where
# bench/engine_overhead (one process for all) measures the engine's own work. Prints each one's median step time,
# minor page faults and system time per step, and engine / Python loop per stage (targets: <= 1.0 at stages 0-2,
# <= 1.05 at stage 3).
# Expected time on a 2-core machine with the defaults: ~4 min.
# Usage: [MODEL=small] [ROUNDS=3] [THREADS=nproc] bench/python_baseline/run.sh [build-dir] [steps]
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, MODEL, ROUNDS, OUT, interleave, ratio
THREADS=${THREADS:-$(nproc)}
for stage in 0 1 2 3; do zero_config "$stage" >"$OUT/stage$stage.json"; done

# The command lines interleave runs (it appends --steps and --metrics). --peak_tflops skips gpt-train's closing
# matmul measurement of the peak, which the MFU it prints needs and this bench does not.
gpt_train=(env OMP_NUM_THREADS="$THREADS" "$BUILD/gpt-train" --no_progress --peak_tflops 1 --model "$MODEL"
  --seq_len 128)
stage0=("${gpt_train[@]}" --deepspeed_config "$OUT/stage0.json")
stage1=("${gpt_train[@]}" --deepspeed_config "$OUT/stage1.json")
stage2=("${gpt_train[@]}" --deepspeed_config "$OUT/stage2.json")
stage3=("${gpt_train[@]}" --deepspeed_config "$OUT/stage3.json")
python=(env OMP_NUM_THREADS="$THREADS" "$PYTHON" "$(dirname "$0")/../python_loop/gpt_loop.py" --model "$MODEL"
  --seq_len 128)

echo "python_baseline: gpt-train $MODEL, 1 process x $THREADS threads, micro-batch ${MICRO_BATCH:-8} x seq 128," \
  "$STEPS steps, $ROUNDS rounds"
interleave stage0 stage1 stage2 stage3 python
ratio stage0 python "(target <= 1.0)"
ratio stage1 python "(target <= 1.0)"
ratio stage2 python "(target <= 1.0)"
ratio stage3 python "(target <= 1.05)"
