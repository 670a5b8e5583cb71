#!/usr/bin/env bash
# `pip install .` as a user runs it, into a fresh virtual environment whose only package of ours is what pip builds:
# the build finds the environment's torch, the wheel's metadata requires exactly that torch, `import dscpp` loads the
# installed package (not build/python), and the `dscpp` console script runs the installed C++ CLI with this
# environment's interpreter as the launcher's.
# The environment sees the build interpreter's site-packages through a .pth (its torch, and scikit-build-core, which
# scripts/setup.sh installs there), and pip runs without build isolation, so the test downloads nothing; pip's default
# isolated build differs only in where scikit-build-core comes from (cmake/dscpp_torch.cmake asks torch of the same
# interpreter either way). A full build of the extension and the CLI: the long label.
# Usage: pip_install_test.sh PYTHON WORK_DIR
set -euo pipefail
PYTHON=$1
WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
"$PYTHON" -c 'import scikit_build_core' ||
  { echo "FAIL: $PYTHON has no scikit-build-core (scripts/setup.sh installs the pinned one)"; exit 1; }
rm -rf "$WORK/venv" && mkdir -p "$WORK"
"$PYTHON" -m venv "$WORK/venv"
VENV_PY=$WORK/venv/bin/python
outer_site=$("$PYTHON" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
venv_site=$("$VENV_PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo "$outer_site" >"$venv_site/outer_torch.pth"
"$VENV_PY" -c 'import torch' || { echo "FAIL: the new environment does not see torch"; exit 1; }
if "$VENV_PY" -c 'import dscpp' 2>/dev/null; then echo "FAIL: dscpp importable before the install"; exit 1; fi

# The build directory is the test's own (pyproject.toml's default lives in the checkout).
(cd "$ROOT" && "$VENV_PY" -m pip install --no-build-isolation --no-deps -v \
  -C build-dir="$WORK/pip-build" . >"$WORK/pip.log" 2>&1) || { tail -40 "$WORK/pip.log"; echo "FAIL: pip install"; exit 1; }

cd "$WORK"  # away from the checkout, so nothing is imported from it
location=$("$VENV_PY" -c 'import dscpp, os; print(os.path.dirname(dscpp.__file__))')
case "$location" in
  "$venv_site"/dscpp) echo "ok: import dscpp from $location" ;;
  *) echo "FAIL: dscpp imported from $location, not $venv_site/dscpp"; exit 1 ;;
esac
requires=$("$VENV_PY" -c 'import importlib.metadata as m; print(m.requires("dscpp"))')
torch_release=$("$PYTHON" -c 'import torch; print(torch.__version__.split("+")[0])')
[ "$requires" = "['torch==$torch_release']" ] || { echo "FAIL: requires $requires, want torch==$torch_release"; exit 1; }
echo "ok: the wheel requires $requires"
"$WORK/venv/bin/dscpp" --help | grep -q "launch" || { echo "FAIL: dscpp --help"; exit 1; }
"$WORK/venv/bin/dscpp" launch --help | grep -q -- "--python TEXT=$VENV_PY\b" ||
  { "$WORK/venv/bin/dscpp" launch --help | grep -- --python; echo "FAIL: the launcher's python is not $VENV_PY"; exit 1; }
echo "ok: dscpp --help, and dscpp launch runs .py programs under $VENV_PY"
# The engine itself, from the installed package: one initialize and step on one process.
"$VENV_PY" - <<'PY'
import torch
import dscpp
model = torch.nn.Linear(4, 1)
engine, _, _, _ = dscpp.initialize(model=model, config={"train_batch_size": 2,
                                                         "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
loss = engine(torch.ones(2, 4)).pow(2).mean()
engine.backward(loss)
engine.step()
print("ok: one step from the installed package, loss", float(loss))
PY
