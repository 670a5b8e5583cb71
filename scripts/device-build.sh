#!/usr/bin/env bash
# Builds deepspeed.cpp on the lent GPU machine, against that machine's PyTorch 2.x LibTorch (CUDA, NCCL), in one step.
# That machine has PyTorch, nvcc, CMake and ninja but no Debian packages and no network, so the small dependencies
# (header-only libraries, GoogleTest, liburing, libaio, protobuf) travel with the working tree as Debian packages:
#
#   scripts/device-build.sh fetch               here: downloads their .debs into .deps/debs (git ignores .deps/)
#   scripts/device-build.sh build [build-dir [target...]]
#                                               there: unpacks them under .deps/root, configures against python3's
#                                               torch and builds the targets (default: all) in build-dir (default
#                                               build-cuda)
#
# scripts/device-check.sh calls it with the targets its tests and benchmarks need.
set -euo pipefail
cd "$(dirname "$0")/.."
DEPS=$PWD/.deps
# Debian 12 names; the runtime libraries come with their -dev packages' headers so the binaries run there too.
PACKAGES=(libgloo-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev liburing-dev liburing2 libaio-dev libaio1
  protobuf-compiler libprotoc32 libprotobuf-dev libprotobuf32 libprotobuf-lite32 zlib1g-dev)

case "${1:-}" in
  fetch)
    mkdir -p "$DEPS/debs"
    (cd "$DEPS/debs" && apt-get download "${PACKAGES[@]}")
    ls "$DEPS/debs"
    ;;
  build)
    BUILD_DIR=${2:-build-cuda}
    TARGETS=("${@:3}")
    if [ ! -d "$DEPS/debs" ]; then
      echo "device-build.sh: no $DEPS/debs; run 'scripts/device-build.sh fetch' here first" >&2
      exit 2
    fi
    rm -rf "$DEPS/root" && mkdir -p "$DEPS/root"
    # dpkg-deb where the machine has it; a .deb is an ar archive, so ar and tar do the same elsewhere.
    for deb in "$DEPS"/debs/*.deb; do
      dpkg-deb -x "$deb" "$DEPS/root" 2>/dev/null || (cd "$DEPS/root" && ar p "$deb" data.tar.xz | tar xJ)
    done
    ROOT=$DEPS/root/usr
    # cmake/dscpp_torch.cmake finds torch through the interpreter and checks its version and string ABI.
    PYTHON=$(python3 -c 'import sys; print(sys.executable)')
    # nccl.h: the toolkit's, else the one PyTorch's nvidia-nccl wheel ships.
    NCCL_HOME=${NCCL_HOME:-$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)}
    export NCCL_HOME CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    export PATH=$ROOT/bin:$PATH LD_LIBRARY_PATH=$ROOT/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # The Python package is off here until it is tried against the wheel's own interpreter and pybind11 headers.
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSCPP_BUILD_BENCH=ON -DDSCPP_BUILD_PYTHON=OFF \
      -DDSCPP_PYTHON="$PYTHON" -DCMAKE_PREFIX_PATH="$ROOT;$ROOT/lib/x86_64-linux-gnu/cmake" \
      -DCMAKE_LIBRARY_PATH="$ROOT/lib/x86_64-linux-gnu" -DCMAKE_INCLUDE_PATH="$ROOT/include" \
      -DProtobuf_PROTOC_EXECUTABLE="$ROOT/bin/protoc"
    cmake --build "$BUILD_DIR" -j"$(nproc)" ${TARGETS[@]:+--target "${TARGETS[@]}"}
    echo "built $BUILD_DIR against torch $(python3 -c 'import torch; print(torch.__version__)')"
    ;;
  *)
    echo "usage: scripts/device-build.sh fetch | build [build-dir [target...]]" >&2
    exit 2
    ;;
esac
