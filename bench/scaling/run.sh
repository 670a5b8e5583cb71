#!/usr/bin/env bash
# bench/scaling: gpt-train `small` with ZeRO-2, one process vs two (one per core, OMP_NUM_THREADS=1), the same
# micro-batch per process (a compute-bound batch), under `dscpp launch`. Prints each run's median tokens/s and the
# ratio two/one (target >= 1.8). Usage: bench/scaling/run.sh [build-dir] [steps]
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, OUT
zero_config 2 >"$OUT/zero2.json"

for n in 1 2; do
  OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus "$n" --master_port $((29600 + n)) \
    "$BUILD/gpt-train" --no_progress --model small --seq_len 128 --steps "$STEPS" \
    --deepspeed_config "$OUT/zero2.json" --metrics "$OUT/run$n.jsonl" 2>"$OUT/log$n.txt" \
    || { cat "$OUT/log$n.txt"; exit 1; }
done
one=$(median "$OUT/run1.jsonl" tokens_per_s)
two=$(median "$OUT/run2.jsonl" tokens_per_s)
echo "scaling: gpt-train small, ZeRO-2, micro-batch 8 x seq 128 per process, OMP_NUM_THREADS=1, $STEPS steps"
echo "  1 process : $one tokens/s"
echo "  2 processes: $two tokens/s"
awk -v a="$one" -v b="$two" 'BEGIN { printf "  ratio 2/1: %.3f (target >= 1.8)\n", b / a }'
