"""scikit-build-core's dynamic-metadata plugin for pyproject.toml: the wheel's dependency on torch is the torch the
extension is built against, to the release (`torch==2.11.0` for 2.11.0+cu130: a public version matches any local
build of it), since an extension loaded into another torch fails on missing symbols.

Under pip's build isolation this process sees only the isolated build environment (pip puts a sitecustomize on
PYTHONPATH that hides the environment's own site-packages), so torch is asked of the same interpreter in a child
process without those variables — as cmake/dscpp_torch.cmake asks it.
"""
import os
import subprocess
import sys


def torch_release(python):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    probe = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], env=env, capture_output=True,
                           text=True)
    if probe.returncode != 0:
        raise RuntimeError(f"dscpp builds against the torch of {python}, which cannot import torch; install a "
                           f"supported torch there first (cmake/dscpp_torch.cmake):\n{probe.stderr}")
    return probe.stdout.strip().split("+")[0]


def dynamic_metadata(settings, project):
    # sys.executable: pip's interpreter, the environment being installed into (scikit-build-core hands CMake the same
    # one as Python_EXECUTABLE, which cmake/dscpp_torch.cmake takes as DSCPP_PYTHON).
    return {"dependencies": [f"torch=={torch_release(sys.executable)}"]}
