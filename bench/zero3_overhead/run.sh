#!/usr/bin/env bash
# bench/zero3_overhead: gpt-train on two processes (one per core, OMP_NUM_THREADS=1, micro-batch 8 x seq 128 each):
# ZeRO-3 against ZeRO-2, ZeRO-3 with prefetch off, and a plain PyTorch loop (bench/python_loop, DDP over Gloo) on the
# same model, data and AdamW, interleaved over ROUNDS rounds (bench/common.sh). Prints the median step time of each,
# the ratios stage 3 / stage 2 (target <= 1.15) and engine / Python loop (targets <= 1.0 at stage 2, <= 1.05 at
# stage 3), and the share of all-gather wait that prefetch hides:
#   hidden = 1 - (gather wait per step with prefetch) / (gather wait per step without prefetch),
# from the engine's timers (gather_wait_s in the metrics: time the forward/backward sat blocked on a gather).
# Expected time on a 2-core machine with the defaults: ~4 min.
# Usage: [MODEL=small] [ROUNDS=3] bench/zero3_overhead/run.sh [build-dir] [steps]
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, MODEL, ROUNDS, OUT, interleave, ratio
zero_config 2 >"$OUT/stage2.json"
zero_config 3 >"$OUT/stage3.json"
zero_config 3 ', "stage3_prefetch_bucket_size": 0' >"$OUT/stage3_noprefetch.json"

# The command lines interleave runs (it appends --steps and --metrics). --peak_tflops skips gpt-train's closing
# matmul measurement of the peak, which the MFU it prints needs and this bench does not.
launch=(env OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 2 --master_port)
gpt_train=("$BUILD/gpt-train" --no_progress --peak_tflops 1 --model "$MODEL" --seq_len 128)
stage2=("${launch[@]}" 29651 "${gpt_train[@]}" --deepspeed_config "$OUT/stage2.json")
stage3=("${launch[@]}" 29652 "${gpt_train[@]}" --deepspeed_config "$OUT/stage3.json")
stage3_noprefetch=("${launch[@]}" 29653 "${gpt_train[@]}" --deepspeed_config "$OUT/stage3_noprefetch.json")
python=("${launch[@]}" 29654 "$PYTHON" "$(dirname "$0")/../python_loop/gpt_loop.py" --model "$MODEL" --seq_len 128)

wait_per_step() {  # gather_wait_s accumulated over steps 4..N, per step
  awk -v n="$STEPS" 'NR == 3 { s = $0 } END { e = $0
    sub(/.*"gather_wait_s":/, "", s); sub(/[,}].*/, "", s); sub(/.*"gather_wait_s":/, "", e); sub(/[,}].*/, "", e)
    printf "%.6f\n", (e - s) / (n - 3) }' "$1"
}
median_wait() {  # NAME: the median over rounds of wait_per_step
  for round in $(seq "$ROUNDS"); do wait_per_step "$OUT/$1.$round.jsonl"; done | median_of
}

echo "zero3_overhead: gpt-train $MODEL, 2 processes, micro-batch 8 x seq 128 each, OMP_NUM_THREADS=1, $STEPS steps," \
  "$ROUNDS rounds"
interleave stage2 stage3 stage3_noprefetch python
ratio stage3 stage2 "(target <= 1.15)"
ratio stage2 python "(target <= 1.0)"
ratio stage3 python "(target <= 1.05)"
awk -v w="$(median_wait stage3)" -v n="$(median_wait stage3_noprefetch)" 'BEGIN {
  printf "  gather wait %.1f ms/step with prefetch, %.1f without: %.1f%% hidden by prefetch\n", 1000 * w, 1000 * n,
    (n > 0) ? 100 * (1 - w / n) : 0 }'
grep -h "ZeRO stage 3" "$OUT/stage3.1.jsonl.log" | head -1
