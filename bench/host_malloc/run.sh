#!/usr/bin/env bash
# bench/host_malloc: gpt-train, ZeRO-2 on two processes (one per core, OMP_NUM_THREADS=1), with the malloc thresholds
# initialize sets (dscpp/engine/host_malloc.h) vs glibc's own adaptive policy (DSCPP_MALLOC_TUNING=0), and a plain
# PyTorch loop (bench/python_loop, DDP over Gloo; glibc's policy) on the same model, data and AdamW, interleaved over
# ROUNDS rounds (bench/common.sh). Prints each one's median step time, page faults and system time per step and
# rank 0's peak RSS, the ratio glibc/tuned of step times and tuned / Python loop (target <= 1.0).
# Expected time on a 2-core machine with the defaults: ~3 min.
# Usage: [MODEL=small] [ROUNDS=3] bench/host_malloc/run.sh [build-dir] [steps]
set -euo pipefail
source "$(dirname "$0")/../common.sh" "$@"  # BUILD, STEPS, MODEL, ROUNDS, OUT, interleave, ratio
zero_config 2 >"$OUT/zero2.json"

# The command lines interleave runs (it appends --steps and --metrics). --peak_tflops skips gpt-train's closing
# matmul measurement of the peak, which the MFU it prints needs and this bench does not.
launch=("$BUILD/dscpp" launch --num_gpus 2 --master_port)
gpt_train=("$BUILD/gpt-train" --no_progress --peak_tflops 1 --model "$MODEL" --seq_len 128
  --deepspeed_config "$OUT/zero2.json")
tuned=(env DSCPP_MALLOC_TUNING=1 OMP_NUM_THREADS=1 "${launch[@]}" 29641 "${gpt_train[@]}")
glibc=(env DSCPP_MALLOC_TUNING=0 OMP_NUM_THREADS=1 "${launch[@]}" 29642 "${gpt_train[@]}")
python=(env OMP_NUM_THREADS=1 "${launch[@]}" 29643 "$PYTHON" "$(dirname "$0")/../python_loop/gpt_loop.py"
  --model "$MODEL" --seq_len 128)

echo "host malloc: gpt-train $MODEL, ZeRO-2, 2 processes, micro-batch 8 x seq 128, OMP_NUM_THREADS=1, $STEPS steps," \
  "$ROUNDS rounds"
interleave tuned glibc python
for run in tuned glibc python; do
  for round in $(seq "$ROUNDS"); do
    tail -n 1 "$OUT/$run.$round.jsonl" | sed -E 's/.*"peak_rss_bytes":([0-9]+).*/\1/'
  done | median_of | awk -v r="$run" '{ printf "  %-6s rank 0 peak RSS %.1f MB\n", r, $1 / 1e6 }'
done
ratio glibc tuned "(step time glibc's policy / ours)"
ratio tuned python "(target <= 1.0)"
