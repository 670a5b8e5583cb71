#!/usr/bin/env bash
# bench/host_malloc: gpt-train `small`, ZeRO-2 on two processes (one per core, OMP_NUM_THREADS=1), with the malloc
# thresholds initialize sets (dscpp/engine/host_malloc.h) vs glibc's own adaptive policy (DSCPP_MALLOC_TUNING=0).
# Prints each run's median step time and peak RSS, and the ratio default/tuned of step times.
# Usage: bench/host_malloc/run.sh [build-dir] [steps]
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-20}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
cat >"$OUT/zero2.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "steps_per_print": 1000,
 "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": 5e5},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}}}
JSON

median() {  # median of a metric over the steps after the first 3 (warm-up)
  tail -n +4 "$1" | sed -E "s/.*\"$2\":([0-9.e+-]+).*/\1/" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

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
