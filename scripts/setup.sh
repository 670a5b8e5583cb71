#!/usr/bin/env bash
# Installs every Debian package the build needs, then configures and builds (Release-with-debug-info, ccache).
# Idempotent: re-running only rebuilds what changed. Usage: scripts/setup.sh [build-dir [target...|none]]
# By default it builds what README's first command runs — the library, `dscpp`, `gpt-train` and the Python package
# `dscpp` (build/python) — and not the tests and benchmarks (scripts/test.sh builds those: `scripts/setup.sh build all`).
#
# Another LibTorch (PyTorch 2.x's, with CUDA): Torch_DIR=<its share/cmake/Torch> scripts/setup.sh build-cuda, e.g.
#   Torch_DIR=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch scripts/setup.sh build-cuda
# Debian's libtorch-dev is then not installed; nccl.h is looked for in NCCL_HOME, CUDA_HOME and /usr/local/cuda.
# On a machine without Debian's packages (the lent GPU machine) use scripts/device-build.sh instead.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(dscpp_cli gpt-train dscpp_python)

PACKAGES=(build-essential cmake ccache git
  libtorch-dev libopenblas0-openmp libgloo-dev
  nlohmann-json3-dev zlib1g-dev libcli11-dev libgtest-dev libgmock-dev
  liburing-dev libaio-dev protobuf-compiler libprotobuf-dev
  python3-torch python3-dev pybind11-dev python3-pytest python3-torchvision  # the Python front end and its tests
  iproute2 openssh-server openssh-client  # tests/multinode: two hosts in network namespaces, the ssh launcher
  time fio)  # the benchmarks: GNU time counts page faults, a plain PyTorch loop and fio are baselines
if [ -n "${Torch_DIR:-}" ]; then
  [ -f "$Torch_DIR/TorchConfig.cmake" ] || { echo "setup.sh: Torch_DIR=$Torch_DIR has no TorchConfig.cmake" >&2; exit 2; }
  PACKAGES=("${PACKAGES[@]/libtorch-dev}")
fi
missing=()
for p in "${PACKAGES[@]}"; do
  [ -n "$p" ] || continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ "${TARGETS[0]}" != none ] || exit 0  # "none": the packages only (scripts/test.sh --sanitize configures its own build)
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${Torch_DIR:+-DTorch_DIR="$Torch_DIR"}
cmake --build "$BUILD_DIR" -j"$JOBS" --target "${TARGETS[@]}"
