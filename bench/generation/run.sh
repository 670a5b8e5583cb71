#!/usr/bin/env bash
# bench/generation: generate() on a ZeRO-3 training engine, 2 processes (one core each, dscpp launch): the hybrid
# engine (every parameter gathered once per call) against ZeRO-3's per-forward gathering, tokens/s and their ratio
# from one run (generation.py, the two interleaved over ROUNDS rounds in one job). Target: >= 10x. Expected time on
# a 2-core machine with the defaults: ~3 min.
# Usage: [ROUNDS=3] bench/generation/run.sh [build-dir] [generation.py flags...]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
shift || true
PYTHON=${PYTHON:-$(sed -n 's/^DSCPP_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")}
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" DSCPP_PYTHON="$PYTHON"
env OMP_NUM_THREADS=1 "$BUILD/dscpp" launch --num_gpus 2 --master_port 29681 \
  "$ROOT/bench/generation/generation.py" --rounds "${ROUNDS:-3}" "$@"
