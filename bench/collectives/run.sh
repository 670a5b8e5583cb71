#!/bin/sh
# Bus bandwidth of all_reduce / reduce_scatter / all_gather over Gloo on loopback, 2 and 4 processes.
# Expected time on a 2-core machine with the defaults: ~2 min (1:48 after the staging pool, 2749d8e).
# Usage: bench/collectives/run.sh [build dir] [extra bench_collectives flags]
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
for n in 2 4; do
  "$build/bench/bench_collectives" --procs "$n" "$@"
  echo
done
