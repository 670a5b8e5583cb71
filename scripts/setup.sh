#!/usr/bin/env bash
# Installs every Debian package the build needs, then configures and builds (Release-with-debug-info, ccache).
# Idempotent: re-running only rebuilds what changed. Usage: scripts/setup.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}

PACKAGES=(build-essential cmake ccache git
  libtorch-dev libopenblas0-openmp libgloo-dev
  nlohmann-json3-dev zlib1g-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
  liburing-dev libaio-dev protobuf-compiler libprotobuf-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j"$JOBS"
