#!/usr/bin/env bash
# bench/long_context: one causal attention layer (batch 1, 4 heads of 64) forward + backward against the sequence
# length, for torch's memory-efficient attention (the dense baseline), the (T, T) attention written out, Ulysses over 2
# and 4 ranks, and dscpp's block-sparse attention on each of DeepSpeed's layouts (block 64): milliseconds, tokens/s
# and peak memory added per rank; then each method's longest sequence in 20 GB, extrapolated from its last two
# lengths' growth. Each (method, length) is a process of its own. The (T, T) attention
# stops at MATH_MAX_T (its scores are 4·T²·4 bytes); Ulysses' ranks run 1 thread each (4 ranks on a 2-core machine
# share the cores: their time is not a speed-up).
# Expected time on a 2-core machine with the defaults: ~6 min (6:20 at 741e88c).
# Usage: [MAX_T=32768] [MATH_MAX_T=8192] bench/long_context/run.sh [build-dir]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
PYTHON=${PYTHON:-$(sed -n 's/^DSCPP_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")}
SITE=$(ls -d "$BUILD"/site/lib/python*/*-packages | head -1)
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
MAX_T=${MAX_T:-32768}
MATH_MAX_T=${MATH_MAX_T:-8192}
HERE=$(cd "$(dirname "$0")" && pwd)
ROWS=$(mktemp "${TMPDIR:-/tmp}/long_context.XXXXXX")
trap 'rm -f "$ROWS"' EXIT

ulysses() {  # ulysses RANKS T: the ranks on loopback, torchrun's environment
  local port=$((29500 + RANDOM % 1000)) pids=()
  for ((r = 0; r < $1; r++)); do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$1 OMP_NUM_THREADS=1 \
      "$PYTHON" "$HERE/long_context.py" ulysses "$2" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
}

for ((T = 1024; T <= MAX_T; T *= 2)); do
  for method in sdpa math ulysses2 ulysses4 fixed variable bigbird bslongformer local; do
    if [ "$method" = math ] && [ "$T" -gt "$MATH_MAX_T" ]; then continue; fi
    case $method in
      ulysses*) ulysses "${method#ulysses}" "$T" ;;
      *) OMP_NUM_THREADS=2 "$PYTHON" "$HERE/long_context.py" "$method" "$T" ;;
    esac | tee -a "$ROWS" || echo "long_context: $method at $T failed; the others go on" >&2
  done
done

"$PYTHON" - "$ROWS" <<'PY'
import json, math, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
methods = list(dict.fromkeys(r["method"] for r in rows))
lengths = sorted({r["seq"] for r in rows})
by = {(r["method"], r["seq"]): r for r in rows}
print("\nlong_context: causal attention, batch 1, 4 heads x 64, forward + backward; per rank for Ulysses")
print(f"{'method':<13} {'density':>8} " + " ".join(f"{T:>17}" for T in lengths))
print(f"{'':<13} {'':>8} " + " ".join(f"{'ms / MB':>17}" for T in lengths))
for m in methods:
    cells = []
    for T in lengths:
        r = by.get((m, T))
        cells.append(f"{r['ms']:>9.0f} / {r['peak_mb']:<5.0f}" if r else f"{'-':>17}")
    density = by[(m, max(T for (n, T) in by if n == m))]["density"]
    print(f"{m:<13} {density:>8.3f} " + " ".join(cells))
base = {T: by[("sdpa", T)]["ms"] for T in lengths if ("sdpa", T) in by}
print("\ntokens/s against sdpa's (one run), and the longest sequence in 20 GB (extrapolated from the last two lengths):")
for m in methods:
    mine = sorted(T for (n, T) in by if n == m)
    ratios = " ".join(f"{T}:{base[T] / by[(m, T)]['ms']:.2f}x" for T in mine if T in base)
    (t1, t2) = mine[-2:] if len(mine) > 1 else (mine[0], mine[0])
    m1, m2 = max(by[(m, t1)]["peak_mb"], 1.0), max(by[(m, t2)]["peak_mb"], 1.0)
    growth = math.log(m2 / m1, 2) if t2 > t1 and m2 > m1 else 1.0
    longest = t2 * (20 * 1024 / m2) ** (1 / max(growth, 0.5))
    print(f"  {m:<13} {ratios}   fits ~{longest / 1024:,.0f}K positions in 20 GB (memory x{2 ** growth:.2f} per doubling)")
PY
