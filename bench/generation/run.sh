#!/usr/bin/env bash
# bench/generation: generation, three comparisons, each printed from one run.
#  1. generate() on a ZeRO-3 training engine, 2 processes (one core each): the hybrid engine (every parameter
#     gathered once per call) against ZeRO-3's per-forward gathering, tokens/s and their ratio (generation.py, the
#     two interleaved in one job). Target: >= 10x.
#  2. init_inference's AutoTP at tp 2 on 2 processes (one core each) against the plain model on one process with two
#     threads, the same two cores (autotp.py); the ratio of the medians.
#  3. ZeRO-Inference with the weights on NVMe against in memory, 2 processes (zero_inference.py).
# Expected time on a 2-core machine with the defaults: ~4 min.
# Usage: [ROUNDS=3] bench/generation/run.sh [build-dir]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
HERE="$ROOT/bench/generation"
PYTHON=${PYTHON:-$(sed -n 's/^DSCPP_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")}
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" DSCPP_PYTHON="$PYTHON"
ROUNDS=${ROUNDS:-3}
launch=(env OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 2 --master_port)
NVME=$(mktemp -d "${TMPDIR:-/tmp}/generation_nvme.XXXXXX")
trap 'rm -rf "$NVME"' EXIT

"${launch[@]}" 29681 "$HERE/generation.py" --rounds "$ROUNDS"

one=$(OMP_NUM_THREADS=2 "$PYTHON" "$HERE/autotp.py" --tp 1 --rounds "$ROUNDS" | tail -1)
two=$("${launch[@]}" 29682 "$HERE/autotp.py" --tp 2 --rounds "$ROUNDS" | grep '^autotp' | tail -1)
echo "$one"
echo "$two"
median() { sed -E 's/.*tokens\/s //' | tr -d ' ' | tr '/' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
awk -v a="$(echo "$two" | median)" -v b="$(echo "$one" | median)" \
  'BEGIN {printf "  autotp tp 2 / one process (2 threads) tokens/s (medians): %.3fx\n", a / b}'

"${launch[@]}" 29683 "$HERE/zero_inference.py" --nvme_path "$NVME" --rounds "$ROUNDS"
