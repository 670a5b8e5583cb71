#!/usr/bin/env bash
# Builds (via setup.sh) and runs the default test set: every test not labelled "long".
# Usage: scripts/test.sh [extra ctest args], e.g. scripts/test.sh -L long for the long suites.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build all
cd build
if [ $# -eq 0 ]; then
  ctest --output-on-failure -j"${JOBS:-$(nproc)}" -LE long
else
  ctest --output-on-failure -j"${JOBS:-$(nproc)}" "$@"
fi
