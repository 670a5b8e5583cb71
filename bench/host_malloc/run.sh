#!/usr/bin/env bash
# bench/host_malloc: gpt-train `small`, ZeRO-2 on two processes (one per core, OMP_NUM_THREADS=1), with the malloc
# thresholds initialize sets (dscpp/engine/host_malloc.h) vs glibc's own adaptive policy (DSCPP_MALLOC_TUNING=0).
# Prints each run's median step time and rank 0's peak RSS, and the ratio glibc/tuned of step times.
# Usage: bench/host_malloc/run.sh [build-dir] [steps]
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, OUT
zero_config 2 >"$OUT/zero2.json"

for run in tuned glibc; do
  tuning=1; [ "$run" = glibc ] && tuning=0
  DSCPP_MALLOC_TUNING=$tuning OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 2 --master_port 29640 \
    "$BUILD/gpt-train" --no_progress --model small --seq_len 128 --steps "$STEPS" \
    --deepspeed_config "$OUT/zero2.json" --metrics "$OUT/$run.jsonl" 2>"$OUT/$run.txt" \
    || { cat "$OUT/$run.txt"; exit 1; }
done
tuned=$(median "$OUT/tuned.jsonl" step_ms)
glibc=$(median "$OUT/glibc.jsonl" step_ms)
echo "host malloc: gpt-train small, ZeRO-2, 2 processes, micro-batch 8 x seq 128, OMP_NUM_THREADS=1, $STEPS steps"
for run in tuned glibc; do
  awk -v r="$run" -v ms="$(median "$OUT/$run.jsonl" step_ms)" -v rss="$(tail -n 1 "$OUT/$run.jsonl" |
    sed -E 's/.*"peak_rss_bytes":([0-9]+).*/\1/')" \
    'BEGIN { printf "  %-6s %8.1f ms/step, rank 0 peak RSS %.1f MB\n", r, ms, rss / 1e6 }'
done
awk -v a="$glibc" -v b="$tuned" 'BEGIN { printf "  ratio glibc/tuned step time: %.3f\n", a / b }'
