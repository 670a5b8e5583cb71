#!/usr/bin/env bash
# bench/scaling: gpt-train with ZeRO-2 on the whole 2-core machine two ways: 2 processes x 1 thread (micro-batch 8
# each) against 1 process x 2 threads (micro-batch 16: the same global batch, so the same work per step), under
# `dscpp launch`, interleaved over ROUNDS rounds (bench/common.sh). Prints the median tokens/s of each and the
# headline ratio 2x1 / 1x2; then, as a second line, 2 processes against 1 process x 1 thread (micro-batch 8), the
# scaling ratio of earlier READMEs (target >= 1.8), which two threads' worth of cores makes superlinear-looking.
# Expected time on a 2-core machine with the defaults: ~2 min.
# Usage: [MODEL=small] [ROUNDS=3] bench/scaling/run.sh [build-dir] [steps]
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, MODEL, ROUNDS, OUT, interleave, ratio
FIELD=tokens_per_s
zero_config 2 >"$OUT/zero2.json"
MICRO_BATCH=16 zero_config 2 >"$OUT/zero2_micro16.json"

# The command lines interleave runs (it appends --steps and --metrics). --peak_tflops skips gpt-train's closing
# matmul measurement of the peak, which the MFU it prints needs and this bench does not.
gpt_train=("$BUILD/gpt-train" --no_progress --peak_tflops 1 --model "$MODEL" --seq_len 128)
procs2_threads1=(env OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 2 --master_port 29601
  "${gpt_train[@]}" --deepspeed_config "$OUT/zero2.json")
procs1_threads2=(env OMP_NUM_THREADS=2 "$BUILD/dscpp" launch --num_gpus 1 --master_port 29602
  "${gpt_train[@]}" --deepspeed_config "$OUT/zero2_micro16.json")
procs1_threads1=(env OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 1 --master_port 29603
  "${gpt_train[@]}" --deepspeed_config "$OUT/zero2.json")

echo "scaling: gpt-train $MODEL, ZeRO-2, seq 128, global batch 16 (8 for 1 x 1), $STEPS steps, $ROUNDS rounds"
interleave procs2_threads1 procs1_threads2 procs1_threads1
ratio procs2_threads1 procs1_threads2 "(> 1: processes beat threads)"
ratio procs2_threads1 procs1_threads1 "(vs 1 thread only; target >= 1.8)"
