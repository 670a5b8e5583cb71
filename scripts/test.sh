#!/usr/bin/env bash
# Builds (via setup.sh) and runs the default test set: every test not labelled "long".
# Usage: scripts/test.sh [--sanitize] [extra ctest args], e.g. scripts/test.sh -L long for the long suites.
#   --sanitize: builds everything with ASan + UBSan in build-asan/ (DSCPP_SANITIZE) and runs the same tests there.
#   Suppressions (each with its reason) are in scripts/sanitizers/; a UBSan report fails its test. Slow: a training
#   step runs ~9x longer under ASan (its allocator maps and faults in every large tensor anew); on 2 cores the
#   default tests took 57 min after a build of over an hour — run it in the background with a log.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
if [ "${1:-}" = "--sanitize" ]; then
  shift
  BUILD=build-asan
  scripts/setup.sh "$BUILD" none  # packages only; configured below with the sanitizer on
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSCPP_SANITIZE=ON -DDSCPP_BUILD_BENCH=OFF >/dev/null
  cmake --build "$BUILD" -j"${JOBS:-$(nproc)}"
  supp="$PWD/scripts/sanitizers"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
else
  scripts/setup.sh "$BUILD" all
fi
cd "$BUILD"
if [ $# -eq 0 ]; then
  ctest --output-on-failure -j"${JOBS:-$(nproc)}" -LE long
else
  ctest --output-on-failure -j"${JOBS:-$(nproc)}" "$@"
fi
