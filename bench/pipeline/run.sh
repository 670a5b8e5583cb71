#!/usr/bin/env bash
# bench/pipeline: gpt-train on 4 processes (one thread each; on a 2-core machine they share the cores, so a stage's
# idle time is partly another stage's compute time) as a 4-stage pipeline (--pipeline_parallel 4: the
# embedding, the blocks and the tied head partitioned by parameters), micro-batch 2 × seq 128, over m = 4, 8 and 16
# micro-batches per step (global batch 2m). For each m it prints every stage's measured idle share of its step time
# (blocked on receives and sends) beside 1F1B's bubble (p − 1) / (m + p − 1), the most micro-batches the stage held
# in flight (at most p − s, whatever m is) and its activation peak (CPU tensor bytes above the step's start), so
# the peak stays flat as m grows; then the step time against the strongest baseline on the same 4 processes and
# global batch: plain data parallelism (dp 4, ZeRO-0, micro-batch m / 2), interleaved over ROUNDS rounds.
# What to expect: the idle share tracks the bubble plus the stages' imbalance (partitioned by parameters, the first
# and last stages hold one block beside the embedding or the head, the middle ones two); dp 4 is faster wherever the
# model fits one rank — a pipeline is for models that do not.
# Expected time on a 2-core machine with the defaults: ~5 min.
# Usage: [MODEL=small] [ROUNDS=2] bench/pipeline/run.sh [build-dir] [steps]
set -euo pipefail
ROUNDS=${ROUNDS:-2}
DEFAULT_STEPS=6  # 6 steps of m = 16 micro-batches: the three m in ~5 min
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, MODEL, ROUNDS, OUT, interleave, ratio
launch=(env OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 4 --master_port)
echo "pipeline: $MODEL, 4 processes (one thread each), micro-batch 2 x seq 128, $STEPS steps, $ROUNDS rounds"
for m in 4 8 16; do
  echo "m = $m micro-batches (global batch $((2 * m))):"
  echo "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": $m, \"steps_per_print\": 1000,
   \"zero_optimization\": {\"stage\": 0},
   \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3, \"weight_decay\": 0.1}}}" >"$OUT/pp$m.json"
  MICRO_BATCH=$((m / 2)) zero_config 0 >"$OUT/dp$m.json"
  declare -a "pp$m=(\"\${launch[@]}\" 2969$((m % 10)) \"$BUILD/gpt-train\" --model \"$MODEL\" --seq_len 128 --no_progress
     --deepspeed_config \"$OUT/pp$m.json\" --pipeline_parallel 4)"
  declare -a "dp$m=(\"\${launch[@]}\" 2970$((m % 10)) \"$BUILD/gpt-train\" --model \"$MODEL\" --seq_len 128 --no_progress
     --deepspeed_config \"$OUT/dp$m.json\")"
  interleave "dp$m" "pp$m"
  ratio "pp$m" "dp$m" "(step time, pp 4 / dp 4 on the same global batch)"
  grep -h "pipeline stage" "$OUT/pp$m.$ROUNDS.jsonl.log" | sed 's/^\[gpt-train\] /  /'
done
