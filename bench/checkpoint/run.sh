#!/usr/bin/env bash
# bench/checkpoint: save_checkpoint throughput against raw disk (bench_checkpoint), then `dscpp consolidate` on a
# 12-layer x 512 GPT checkpoint: its peak RSS against the model's size and its largest tensor (streaming means the
# peak grows by about one tensor over the binary's baseline, which the tiny checkpoint's run shows).
# Expected time on a 2-core machine with the defaults: ~2 min.
# Usage: bench/checkpoint/run.sh [build-dir] [params-millions] [dir]
set -euo pipefail
BUILD=${1:-build}
MILLIONS=${2:-100}
DIR=${3:-/tmp/dscpp_bench_checkpoint}
"$BUILD/bench/bench_checkpoint" --params "$MILLIONS" --dir "$DIR"

OUT=$(mktemp -d -p "$(dirname "$DIR")")
trap 'rm -rf "$OUT"' EXIT
echo '{"train_batch_size": 1, "optimizer": {"type": "SGD", "params": {"lr": 1e-2}}}' >"$OUT/sgd.json"
"$BUILD/gpt-train" --no_progress --model tiny --n_layer 12 --n_embd 512 --n_head 8 --seq_len 16 --steps 1 \
  --deepspeed_config "$OUT/sgd.json" --save_dir "$OUT/big" 2>"$OUT/big.log" || { cat "$OUT/big.log"; exit 1; }
"$BUILD/gpt-train" --no_progress --model tiny --seq_len 16 --steps 1 \
  --deepspeed_config "$OUT/sgd.json" --save_dir "$OUT/small" 2>"$OUT/small.log" || { cat "$OUT/small.log"; exit 1; }
big=$("$BUILD/dscpp" consolidate "$OUT/big" "$OUT/big_out" | tail -1)
small=$("$BUILD/dscpp" consolidate "$OUT/small" "$OUT/small_out" | tail -1)
rss() { sed -E 's/.*peak RSS ([0-9]+) bytes.*/\1/' <<<"$1"; }
model=$(stat -c %s "$OUT/big_out/model.safetensors")
echo "consolidate (gpt 12 x 512, fp32):"
echo "  $big"
echo "  tiny checkpoint, same binary: peak RSS $(rss "$small") bytes"
awk -v b="$(rss "$big")" -v s="$(rss "$small")" -v m="$model" 'BEGIN {
  printf "  peak RSS growth for a %.1f MB model: %.1f MB (%.3f of the model; the largest tensor is 4.2 MB)\n",
         m / 1e6, (b - s) / 1e6, (b - s) / m }'
