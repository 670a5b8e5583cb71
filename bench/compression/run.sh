#!/usr/bin/env bash
# bench/compression: what DeepSpeed Compression's recipes buy on gpt-train's tiny GPT — the model's bytes and its
# held-out loss after the same fine-tuning budget, for fp32 (no compression), 8-bit weights, 4-bit weights, ZeroQuant
# (8-bit weights and activations) and XTC (ternary weights, 2 of the teacher's 4 layers, distilled). One teacher,
# trained once; each row is examples/python/compression.py --recipe R on it, one process.
# Expected time on a 2-core machine with the defaults: ~4 min.
# Usage: [STEPS=100] [TEACHER_STEPS=300] bench/compression/run.sh [build-dir]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
PYTHON=${PYTHON:-$(sed -n 's/^DSCPP_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")}
export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
STEPS=${STEPS:-100}
TEACHER_STEPS=${TEACHER_STEPS:-300}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/compression_bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

for recipe in fp32 w8 w4 zeroquant xtc; do
  OMP_NUM_THREADS=2 "$PYTHON" "$ROOT/examples/python/compression.py" --recipe "$recipe" --steps "$STEPS" \
    --teacher_steps "$TEACHER_STEPS" --teacher "$WORK/teacher.pt" | tail -1 >> "$WORK/rows.jsonl"
done
"$PYTHON" - "$WORK/rows.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(f"compression: tiny GPT, {rows[0]['teacher_bytes']} fp32 bytes, teacher eval loss {rows[0]['teacher_loss']:.4f}")
print(f"  {'recipe':<10} {'bytes':>9} {'of fp32':>8} {'eval loss':>10} {'before fine-tuning':>19}")
for r in rows:
    print(f"  {r['recipe']:<10} {r['bytes']:>9} {r['bytes'] / r['teacher_bytes']:>7.3f}x {r['cleaned']:>10.4f} "
          f"{r['before']:>19.4f}")
PY
