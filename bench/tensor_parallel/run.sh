#!/usr/bin/env bash
# bench/tensor_parallel: the same global batch on 2 processes (one core each), the model sliced over them (tp 2,
# gpt-train --tensor_parallel 2, micro-batch 16 on the one data-parallel rank) against plain data parallelism (dp 2,
# micro-batch 8 per rank), ZeRO stage 0, interleaved over ROUNDS rounds (bench/common.sh). Prints the step-time ratio
# tp / dp and, from the last round, rank 0's model-state bytes and peak RSS in each layout. What to expect: tp halves
# the model states a rank holds and pays two all-reduces of the activations per block and direction; dp reduces the
# gradients once per step.
# Expected time on a 2-core machine with the defaults: ~2 min.
# Usage: [MODEL=small] [ROUNDS=3] bench/tensor_parallel/run.sh [build-dir] [steps]
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, MODEL, ROUNDS, OUT, interleave, ratio
MICRO_BATCH=16 zero_config 0 >"$OUT/tp.json"
MICRO_BATCH=8 zero_config 0 >"$OUT/dp.json"
launch=(env OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 2 --master_port)
tp=("${launch[@]}" 29681 "$BUILD/gpt-train" --model "$MODEL" --seq_len 128 --no_progress --deepspeed_config "$OUT/tp.json"
    --tensor_parallel 2)
dp=("${launch[@]}" 29682 "$BUILD/gpt-train" --model "$MODEL" --seq_len 128 --no_progress --deepspeed_config "$OUT/dp.json")

echo "tensor_parallel: $MODEL, 2 processes (one core each), global batch 16 x seq 128, $STEPS steps, $ROUNDS rounds"
interleave dp tp
ratio tp dp "(step time, tp 2 / dp 2)"
for name in dp tp; do
  python3 - "$OUT/$name.$ROUNDS.jsonl" "$name" <<'PY'
import json, sys
last = [json.loads(line) for line in open(sys.argv[1])][-1]
m = last["memory"]
print(f"  {sys.argv[2]}: rank 0 model states {m['model_states'] / 2**20:.1f} MiB (params {m['params'] / 2**20:.1f}, "
      f"grads {m['grads'] / 2**20:.1f}, optimizer state {m['optimizer_state'] / 2**20:.1f}), "
      f"peak RSS {last['peak_rss_bytes'] / 2**20:.0f} MiB")
PY
done
