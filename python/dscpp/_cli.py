"""The `dscpp` command of an installed package (pyproject.toml's console script): runs the C++ CLI installed beside
the package (dscpp/bin/dscpp), with this interpreter as the one `dscpp launch` runs .py programs under (DSCPP_PYTHON,
read by the launcher), so a wheel installed into any environment launches that environment's Python."""
import importlib.util
import os
import sys


def torch_lib_dir():
    """torch/lib of the torch this interpreter imports (found, not imported: that takes seconds). The binary's RPATH
    names the torch installed beside dscpp; this also finds one elsewhere on sys.path."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"dscpp: {sys.executable} cannot import torch, which the dscpp command links")
    return os.path.join(list(spec.submodule_search_locations)[0], "lib")


def main(argv=None):
    """`dscpp ARGV...` (default: this process's arguments)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "dscpp")
    if not os.path.exists(binary):
        sys.exit(f"dscpp: {binary} is missing; this package was not installed by pip (a build tree has build/dscpp)")
    os.environ.setdefault("DSCPP_PYTHON", sys.executable)
    library_path = os.environ.get("LD_LIBRARY_PATH")
    os.environ["LD_LIBRARY_PATH"] = torch_lib_dir() + (os.pathsep + library_path if library_path else "")
    os.execv(binary, [binary] + argv)


if __name__ == "__main__":
    main()
