#!/usr/bin/env bash
# bench/run_all.sh: every benchmark in sequence with its defaults, then bench/RESULTS.md — each one's output as it
# printed it, how long it took against the time its header states, and the machine (CPU kind, SIMD, cores, memory,
# disk), the date and the commit. Expected time on a 2-core machine: ~36 min on torch 2.11 (22:27 in bench/RESULTS.md of
# e6962d7, before bench/vs_deepspeed, ~8 min, was added; 49:17 on torch 1.13).
#
# Each benchmark runs under `timeout` (twice its stated time: a hang ends, the others still run) and with a limit on
# each process's address space (prlimit --as), so that one that outgrows the machine fails with an error instead of
# waking the kernel's OOM killer. The limits are per process and generous (address space counts mappings never
# touched: libraries, thread stacks, malloc arenas); scale_demo, the one that fills the machine, sets its own.
# A failing benchmark is recorded with its exit status and the run goes on.
#
# Usage: bench/run_all.sh [build-dir] [results-file]   (the benchmarks' executables are built first, incrementally)
#   ONLY="memory soak" bench/run_all.sh   runs only those (their results file says so)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(realpath -m "${1:-$ROOT/build}")
RESULTS=$(realpath -m "${2:-$ROOT/bench/RESULTS.md}")
cd "$ROOT"
command -v fio >/dev/null && [ -x /usr/bin/time ] || { echo "run_all.sh: needs fio and GNU time (scripts/setup.sh)"; exit 2; }
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  echo "run_all.sh: $BUILD is not configured; run README command 1 (scripts/setup.sh) first" >&2
  exit 2
fi
cmake -S . -B "$BUILD" -DDSCPP_BUILD_BENCH=ON >/dev/null &&
  cmake --build "$BUILD" -j"$(nproc)" --target gpt-train dscpp_cli dscpp_python bench_engine_overhead bench_cpu_adam \
    bench_collectives bench_checkpoint bench_nvme_swap bench_scale_summary >/dev/null ||
  { echo "run_all.sh: the build failed" >&2; exit 1; }

GiB=$((1 << 30))
# name | minutes stated in its header | address-space limit per process, GiB | command (run from the checkout)
BENCHES=(
  "gpt_train_mfu|2|8|$BUILD/gpt-train --no_progress"  # README command 1's job: its last line is MFU, two ways
  "cpu_adam|1|8|$BUILD/bench/bench_cpu_adam"
  "collectives|2|8|bench/collectives/run.sh $BUILD"
  "checkpoint|2|8|bench/checkpoint/run.sh $BUILD"
  "nvme_swap|2|8|bench/nvme_swap/run.sh $BUILD"
  "engine_overhead|4|8|$BUILD/bench/bench_engine_overhead"
  "memory|2|8|bench/memory/run.sh $BUILD"
  "python_baseline|4|8|bench/python_baseline/run.sh $BUILD"
  "python_overhead|4|8|bench/python_overhead/run.sh $BUILD"
  "vs_deepspeed|8|8|bench/vs_deepspeed/run.sh $BUILD"
  "scaling|2|8|bench/scaling/run.sh $BUILD"
  "zero3_overhead|3|8|bench/zero3_overhead/run.sh $BUILD"
  "compressed_comm|5|8|bench/compressed_comm/run.sh $BUILD"
  "host_malloc|3|8|bench/host_malloc/run.sh $BUILD"
  "tensor_parallel|2|8|bench/tensor_parallel/run.sh $BUILD"
  "moe|2|8|bench/moe/run.sh $BUILD"
  "pipeline|4|8|bench/pipeline/run.sh $BUILD"
  "generation|3|8|bench/generation/run.sh $BUILD"
  "compression|4|4|bench/compression/run.sh $BUILD"
  "long_context|6|24|bench/long_context/run.sh $BUILD"
  "soak|3|8|bench/soak/run.sh $BUILD"
  "scale_demo|25|0|bench/scale_demo/run.sh $BUILD"
)

LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
summary=()
started=$(date +%s)
for entry in "${BENCHES[@]}"; do
  IFS='|' read -r name minutes gib command <<<"$entry"
  if [ -n "${ONLY:-}" ] && ! grep -qw "$name" <<<"$ONLY"; then continue; fi
  echo "== $name (stated: ~$minutes min): $command"
  limit=()
  [ "$gib" -eq 0 ] || limit=(prlimit --as=$((gib * GiB)) --)
  t0=$(date +%s)
  # shellcheck disable=SC2086  # the command is a word list by design
  timeout --kill-after=30 $((minutes * 2 * 60)) "${limit[@]}" $command >"$LOGS/$name.txt" 2>&1
  rc=$?
  took=$(( $(date +%s) - t0 ))
  tail -3 "$LOGS/$name.txt"
  status=ok
  [ "$rc" -eq 0 ] || status="exit $rc"
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || status="timed out (rc $rc)"
  printf '   %s in %d:%02d\n' "$status" $((took / 60)) $((took % 60))
  summary+=("| \`$name\` | \`${command//$BUILD/build}\` | ~$minutes min | $((took / 60)):$(printf %02d $((took % 60))) | $status |")
  echo "$name|$took|$status" >>"$LOGS/index"
done
total=$(( $(date +%s) - started ))

cpu=$(sed -nE 's/^model name\s*: //p' /proc/cpuinfo | head -1)
flags=$(grep -m1 '^flags' /proc/cpuinfo)
simd=$(for f in avx2 avx512f avx512_bf16 amx_bf16; do grep -qw "$f" <<<"$flags" && printf '%s ' "$f"; done)
mem=$(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit+=" (with uncommitted changes)"
{
  echo "# Benchmark results"
  echo
  echo "One run of \`bench/run_all.sh\`${ONLY:+ (ONLY=\"$ONLY\")}: every benchmark with its defaults, in sequence, on"
  echo "one machine. Figures are as each benchmark printed them; what each measures and against which baseline is in"
  echo "its header (bench/<name>/)."
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $commit"
  echo "- CPU: $cpu; $(nproc) cores; SIMD: ${simd:-none of avx2/avx512}"
  echo "- memory: $mem; disk under /tmp: $(df -h --output=size,avail /tmp | tail -1 | awk '{print $1 " (" $2 " free)"}')"
  echo "- torch $("$(sed -n 's/^DSCPP_PYTHON:[A-Z]*=//p' "$BUILD/CMakeCache.txt")" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '?'), $(gcc -dumpfullversion 2>/dev/null | sed 's/^/gcc /')"
  echo "- total: $((total / 60)) min $((total % 60)) s"
  echo
  echo "| benchmark | command | stated | took | result |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${summary[@]}"
  while IFS='|' read -r name took status; do
    echo
    echo "## $name"
    echo
    echo '```'
    # The bars of a progress display, if any, are carriage-return lines: keep the last state of each.
    sed -e 's/.*\r//' "$LOGS/$name.txt"
    echo '```'
  done <"$LOGS/index"
} >"$RESULTS"
echo "run_all.sh: $((total / 60)) min $((total % 60)) s; results in $RESULTS"
