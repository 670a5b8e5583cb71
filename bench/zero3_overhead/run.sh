#!/usr/bin/env bash
# bench/zero3_overhead: gpt-train `small` on two processes (one per core, OMP_NUM_THREADS=1, micro-batch 8 x seq 128
# each), ZeRO-3 against ZeRO-2 in one run, plus ZeRO-3 with prefetch off. Prints the median step time of each, the
# ratio stage 3 / stage 2 (target <= 1.15), and the share of all-gather wait that prefetch hides:
#   hidden = 1 - (gather wait per step with prefetch) / (gather wait per step without prefetch),
# from the engine's timers (gather_wait_s in the metrics: time the forward/backward sat blocked on a gather).
# Usage: bench/zero3_overhead/run.sh [build-dir] [steps]
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, OUT
zero_config 2 >"$OUT/stage2.json"
zero_config 3 >"$OUT/stage3.json"
zero_config 3 ', "stage3_prefetch_bucket_size": 0' >"$OUT/stage3_noprefetch.json"

wait_per_step() {  # gather_wait_s accumulated over steps 4..N, per step
  awk -v n="$STEPS" 'NR == 3 { s = $0 } END { e = $0
    sub(/.*"gather_wait_s":/, "", s); sub(/[,}].*/, "", s); sub(/.*"gather_wait_s":/, "", e); sub(/[,}].*/, "", e)
    printf "%.6f", (e - s) / (n - 3) }' "$1"
}

port=29650
for run in stage2 stage3 stage3_noprefetch; do
  port=$((port + 1))
  OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 2 --master_port "$port" \
    "$BUILD/gpt-train" --no_progress --model small --seq_len 128 --steps "$STEPS" \
    --deepspeed_config "$OUT/$run.json" --metrics "$OUT/$run.jsonl" 2>"$OUT/$run.log" \
    || { cat "$OUT/$run.log"; exit 1; }
done
s2=$(median "$OUT/stage2.jsonl" step_ms)
s3=$(median "$OUT/stage3.jsonl" step_ms)
s3n=$(median "$OUT/stage3_noprefetch.jsonl" step_ms)
w3=$(wait_per_step "$OUT/stage3.jsonl")
w3n=$(wait_per_step "$OUT/stage3_noprefetch.jsonl")
echo "zero3_overhead: gpt-train small, 2 processes, micro-batch 8 x seq 128 each, OMP_NUM_THREADS=1, $STEPS steps"
echo "  ZeRO-2                 : $s2 ms/step (median)"
echo "  ZeRO-3                 : $s3 ms/step, gather wait $w3 s/step"
echo "  ZeRO-3, prefetch off   : $s3n ms/step, gather wait $w3n s/step"
awk -v a="$s2" -v b="$s3" 'BEGIN { printf "  ratio ZeRO-3 / ZeRO-2: %.3f (target <= 1.15)\n", b / a }'
awk -v w="$w3" -v n="$w3n" 'BEGIN { printf "  all-gather wait hidden by prefetch: %.1f%%\n", (n > 0) ? 100 * (1 - w / n) : 0 }'
grep -h "ZeRO stage 3" "$OUT/stage3.log" | head -1
