#!/usr/bin/env bash
# bench/memory: bytes per rank after one training step, for stages 0-3 and N = 1, 2, 4 processes (gpt-train, bf16,
# AdamW), three ways against zero/memory_estimate.h's formulas for bf16 + Adam (stage 0: 16Ψ, stage 1: 4Ψ+12Ψ/N,
# stage 2: 2Ψ+14Ψ/N, stage 3: 16Ψ/N):
#   ledger  the engine's model-state bytes (params, grads, fp32 master, Adam state), as it accounts them;
#   live    what LibTorch's CPU allocator holds for live tensors (the counting allocator gpt-train installs before
#           it builds the model): model states plus communication buffers, the data and anything else alive;
#   rss     the process's resident set: all of the above plus LibTorch's code, malloc's free lists, thread stacks.
# Every rank's numbers come from the engine's memory_breakdown (one exchange); the max over ranks is printed, and
# live - ledger, what the formula leaves out. Stage 3 runs with stage3_param_persistence_threshold 0 (every parameter
# partitioned).
# Expected time on a 2-core machine with the defaults: ~2 min (12 one-step runs).
# Usage: bench/memory/run.sh [build-dir] [model]
set -euo pipefail
BUILD=${1:-build}
MODEL=${2:-small}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
psi=$("$BUILD/gpt-train" --no_progress --peak_tflops 1 --model "$MODEL" --steps 1 --seq_len 16 --micro_batch 1 2>&1 \
      | sed -nE 's/.*model [^ ]+ \(([0-9]+) params.*/\1/p')
[ -n "$psi" ] || { echo "could not read the parameter count from gpt-train" >&2; exit 1; }
echo "memory: gpt-train $MODEL, bf16, AdamW, Ψ = $psi parameters; bytes per rank after step 1 (max over ranks), MB"
printf '%-6s %-3s %10s %10s %8s %10s %10s %10s\n' stage N formula ledger diff live live-ledger rss
for stage in 0 1 2 3; do
  for n in 1 2 4; do
    cat >"$OUT/c.json" <<JSON
{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": true},
 "memory_breakdown": true, "steps_per_print": 1000,
 "zero_optimization": {"stage": $stage, "reduce_bucket_size": 5e5, "stage3_param_persistence_threshold": 0},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
JSON
    OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus "$n" --master_port $((29700 + 10 * stage + n)) \
      "$BUILD/gpt-train" --no_progress --peak_tflops 1 --model "$MODEL" --seq_len 16 --steps 1 \
      --deepspeed_config "$OUT/c.json" --metrics "$OUT/m.jsonl" 2>"$OUT/log.txt" || { cat "$OUT/log.txt"; exit 1; }
    python3 - "$OUT/m.jsonl" "$stage" "$n" "$psi" <<'PY'
import json, sys
line = json.loads(open(sys.argv[1]).readline())
stage, n, psi = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
formula = {0: 16 * psi, 1: 4 * psi + 12 * psi / n, 2: 2 * psi + 14 * psi / n, 3: 16 * psi / n}[stage]
ranks = line["memory_ranks"]
assert len(ranks) == n, f"{len(ranks)} ranks reported, {n} launched"
ledger = max(r["model_states"] for r in ranks)
live = max(r["live_tensors"] for r in ranks)
rss = max(r["rss"] for r in ranks)
extra = max(r["live_tensors"] - r["model_states"] for r in ranks)
mb = 1e6
print(f"{stage:<6} {n:<3} {formula / mb:10.2f} {ledger / mb:10.2f} {100 * (ledger - formula) / formula:+7.2f}% "
      f"{live / mb:10.2f} {extra / mb:10.2f} {rss / mb:10.2f}")
PY
  done
done
