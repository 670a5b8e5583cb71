#!/usr/bin/env bash
# Fuzzes every parser of outside input (fuzz/: config, hostfile + include/exclude, manifest, safetensors, HF index,
# plot jsonl, gpt-train's llm.c .bin token file) with libFuzzer under ASan + UBSan, each for SECONDS (default 60),
# starting from fuzz/corpus/<name>.
# Usage: scripts/fuzz.sh [SECONDS [TARGET...]]
# Builds in build-fuzz/ with clang (Debian's clang and libclang-rt-dev). New inputs go to build-fuzz/corpus/<name>,
# never into the repository; a crash is written to build-fuzz/crashes/<name>/ and ends the script with exit 1 — add
# that file to fuzz/corpus/<name>/ with the fix, and the default tests replay it from then on.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(config hostfile manifest safetensors hf_index plot token_file)
BUILD=build-fuzz

for p in clang libclang-rt-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || {
    echo "fuzz.sh: Debian package $p is missing (apt-get install clang libclang-rt-dev)" >&2; exit 2; }
done
CC=clang CXX=clang++ cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSCPP_FUZZ=ON \
  -DDSCPP_BUILD_TESTS=OFF -DDSCPP_BUILD_BENCH=OFF -DDSCPP_BUILD_EXAMPLES=OFF -DDSCPP_BUILD_PYTHON=OFF >/dev/null
cmake --build "$BUILD" -j"${JOBS:-$(nproc)}" --target "${TARGETS[@]/#/fuzz_}"

status=0
for name in "${TARGETS[@]}"; do
  work="$BUILD/corpus/$name" crashes="$BUILD/crashes/$name"
  mkdir -p "$work" "$crashes"
  # LibTorch's own allocations are not ours to judge (it is not instrumented); leaks in our code are.
  log="$BUILD/fuzz_$name.log"
  if ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "$BUILD/fuzz/fuzz_$name" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
      -artifact_prefix="$crashes/" -print_final_stats=1 "$work" "fuzz/corpus/$name" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    echo "fuzz $name: $runs executions in ${SECONDS_EACH} s, no crash (corpus $(ls "$work" | wc -l) inputs)"
  else
    echo "fuzz $name: FAILED — see $log and $crashes/" >&2
    status=1
  fi
done
exit $status
