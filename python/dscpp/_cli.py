"""The `dscpp` command of an installed package (pyproject.toml's console script): runs the C++ CLI installed beside
the package (dscpp/bin/dscpp), with this interpreter as the one `dscpp launch` runs .py programs under (DSCPP_PYTHON,
read by the launcher), so a wheel installed into any environment launches that environment's Python."""
import os
import sys


def main():
    binary = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "dscpp")
    if not os.path.exists(binary):
        sys.exit(f"dscpp: {binary} is missing; this package was not installed by pip (a build tree has build/dscpp)")
    os.environ.setdefault("DSCPP_PYTHON", sys.executable)
    os.execv(binary, [binary] + sys.argv[1:])


if __name__ == "__main__":
    main()
