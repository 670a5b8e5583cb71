#!/usr/bin/env bash
# bench/memory: model-state bytes per rank measured by the engine (gpt-train --metrics) against SPEC §3.6's formulas
# for bf16 + Adam (stage 0: 16Ψ, stage 1: 4Ψ+12Ψ/N, stage 2: 2Ψ+14Ψ/N, stage 3: 16Ψ/N), for stages 0-3 and N = 1, 2, 4.
# Stage 3 runs with stage3_param_persistence_threshold 0 (every parameter partitioned); with a threshold, the
# persistent parameters' gathered copy comes on top and is printed by the engine as "persistent params".
# Usage: bench/memory/run.sh [build-dir] [model]
set -euo pipefail
BUILD=${1:-build}
MODEL=${2:-tiny}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
psi=$("$BUILD/gpt-train" --no_progress --model "$MODEL" --steps 1 --seq_len 16 --micro_batch 1 2>&1 \
      | sed -nE 's/.*model [^ ]+ \(([0-9]+) params.*/\1/p')
[ -n "$psi" ] || { echo "could not read the parameter count from gpt-train" >&2; exit 1; }
echo "memory: gpt-train $MODEL, bf16, AdamW, Ψ = $psi parameters; bytes per rank (model states: params, grads, master, Adam)"
printf '%-6s %-3s %14s %14s %9s\n' stage N measured formula diff
for stage in 0 1 2 3; do
  for n in 1 2 4; do
    cat >"$OUT/c.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "zero_optimization": {"stage": $stage, "reduce_bucket_size": 5e5, "stage3_param_persistence_threshold": 0},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
JSON
    OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus "$n" --master_port $((29700 + 10 * stage + n)) \
      "$BUILD/gpt-train" --no_progress --model "$MODEL" --seq_len 16 --steps 1 --deepspeed_config "$OUT/c.json" \
      --metrics "$OUT/m.jsonl" 2>"$OUT/log.txt" || { cat "$OUT/log.txt"; exit 1; }
    measured=$(sed -nE 's/.*"model_states":([0-9]+).*/\1/p' "$OUT/m.jsonl" | head -1)
    formula=$(awk -v s="$stage" -v n="$n" -v p="$psi" 'BEGIN {
      if (s == 0) f = 16 * p; else if (s == 1) f = 4 * p + 12 * p / n; else if (s == 2) f = 2 * p + 14 * p / n;
      else f = 16 * p / n; printf "%.0f", f }')
    awk -v s="$stage" -v n="$n" -v m="$measured" -v f="$formula" \
      'BEGIN { printf "%-6d %-3d %14d %14d %+8.3f%%\n", s, n, m, f, 100 * (m - f) / f }'
  done
done
