#!/usr/bin/env bash
# Installs what the build needs, then configures and builds (Release-with-debug-info, ccache).
# Idempotent: re-running only rebuilds what changed. Usage: scripts/setup.sh [build-dir [target...|none]]
# By default it builds what README's first command runs — the library, `dscpp`, `gpt-train` and the Python package
# `dscpp` (build/python) — and not the tests and benchmarks (scripts/test.sh builds those: `scripts/setup.sh build all`).
#
# torch is PyTorch from PyPI, the one our users have. The build uses the torch of the active Python (a virtual
# environment's, or PYTHON=/path/to/python) when it is one we support (cmake/dscpp_torch.cmake names the range);
# otherwise it makes .venv here (python3 -m venv) and installs the pinned torch into it, with what the Python tests
# use. The pin is the torch of the lent GPU machine, whose PyPI wheel is built for CUDA 13.0 — the toolkit on our
# machines — so the one wheel serves the CPU build here and the CUDA build there.
# Debian's packages supply everything else (GoogleTest, CLI11, nlohmann-json, liburing, protobuf, Gloo's headers, …).
# On the lent GPU machine (no Debian packages, no network) use scripts/device-build.sh instead.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(dscpp_cli gpt-train dscpp_python)

TORCH_PIN=2.11.0
# torchvision 0.26 is torch 2.11's; scikit-build-core is pyproject.toml's build backend (the pip-install test builds
# without isolation, so it comes from here).
# wheel: building DeepSpeed's source distribution (below) needs bdist_wheel, which this setuptools lacks.
# accelerate, transformers, trl (+ its datasets): Hugging Face's DeepSpeed paths run on real DeepSpeed and on ours
# (tests/conformance).
PYTHON_TEST_PACKAGES=(pytest==9.2.0 numpy==2.4.6 torchvision==0.26.0 scikit-build-core==1.1.2 wheel==0.45.1
  accelerate==1.15.0 transformers==5.24.0 trl==1.16.0 datasets==5.2.0)
# Real DeepSpeed, the reference tests/conformance runs the same scripts on (never imported by the engine). PyPI has its
# source only; built without isolation against this torch (isolation would download a second torch), no ops compiled.
DEEPSPEED_PIN=0.19.8

PACKAGES=(build-essential cmake ccache git
  libgloo-dev  # ProcessGroupGloo.hpp's includes, which the torch wheel does not ship (docs/torch.md)
  nlohmann-json3-dev zlib1g-dev libcli11-dev libgtest-dev libgmock-dev
  liburing-dev libaio-dev protobuf-compiler libprotobuf-dev
  python3-dev python3-venv  # the Python front end for Debian's python3, and .venv
  iproute2 openssh-server openssh-client  # tests/multinode: two hosts in network namespaces, the ssh launcher
  time fio)  # the benchmarks: GNU time counts page faults, fio is a baseline
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

# The interpreter: PYTHON if given, else the active python3 when its torch is supported, else .venv with the pin.
# The supported range is cmake/dscpp_torch.cmake's (DSCPP_TORCH_MIN, DSCPP_TORCH_BELOW: major.minor).
range() { sed -n "s/^set($1 \([0-9]*\)\.\([0-9]*\))$/(\1, \2)/p" cmake/dscpp_torch.cmake; }
MIN=$(range DSCPP_TORCH_MIN) BELOW=$(range DSCPP_TORCH_BELOW)
supported="import sys, torch; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(not $MIN <= v < $BELOW)"
if [ -n "${PYTHON:-}" ]; then
  "$PYTHON" -c "$supported" || { echo "setup.sh: PYTHON=$PYTHON has no supported torch (>= $MIN, < $BELOW)" >&2; exit 2; }
elif command -v python3 >/dev/null && python3 -c "$supported" 2>/dev/null; then
  PYTHON=$(python3 -c 'import sys; print(sys.executable)')
else
  PYTHON=$PWD/.venv/bin/python
  [ -x "$PYTHON" ] || python3 -m venv .venv
  if ! "$PYTHON" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_PIN')" 2>/dev/null; then
    "$PYTHON" -m pip install -q --disable-pip-version-check "torch==$TORCH_PIN"
  fi
  "$PYTHON" -m pip install -q --disable-pip-version-check "${PYTHON_TEST_PACKAGES[@]}"
  if ! "$PYTHON" -c "import importlib.metadata as m, sys; sys.exit(m.version('deepspeed') != '$DEEPSPEED_PIN')" 2>/dev/null; then
    DS_BUILD_OPS=0 "$PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation "deepspeed==$DEEPSPEED_PIN"
  fi
fi
echo "setup.sh: building against torch $("$PYTHON" -c 'import torch; print(torch.__version__)') of $PYTHON"

[ "${TARGETS[0]}" != none ] || exit 0  # "none": packages and torch only (scripts/test.sh --sanitize configures its own build)
JOBS=${JOBS:-$(nproc)}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDSCPP_PYTHON="$PYTHON"
cmake --build "$BUILD_DIR" -j"$JOBS" --target "${TARGETS[@]}"
