# The one torch: PyTorch 2.x from PyPI, found through the Python interpreter that has it (DSCPP_PYTHON). The engine
# links that interpreter's LibTorch (site-packages/torch/lib) and the Python package is built for that interpreter,
# so `import dscpp` and the engine always run on the same torch.
#
# DSCPP_PYTHON: the interpreter given with -DDSCPP_PYTHON=..., else pip's under `pip install .`, else the active virtual
# environment's, else the repository's .venv (scripts/setup.sh makes it), else python3 on PATH.
# Supported: torch >= DSCPP_TORCH_MIN and < DSCPP_TORCH_BELOW (scripts/setup.sh reads the two lines below to choose an
# interpreter); CI pins the version in scripts/setup.sh (TORCH_PIN). Another version stops the configure, naming both
# (tests/build checks it).

set(DSCPP_TORCH_MIN 2.11)
set(DSCPP_TORCH_BELOW 2.12)

if(NOT DSCPP_PYTHON)
  if(SKBUILD AND Python_EXECUTABLE)
    # `pip install .` (pyproject.toml): the interpreter pip installs for.
    set(default_python "${Python_EXECUTABLE}")
  elseif(DEFINED ENV{VIRTUAL_ENV} AND EXISTS "$ENV{VIRTUAL_ENV}/bin/python")
    set(default_python "$ENV{VIRTUAL_ENV}/bin/python")
  elseif(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(default_python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  else()
    find_program(default_python NAMES python3 python)
  endif()
  set(DSCPP_PYTHON "${default_python}" CACHE FILEPATH "The Python interpreter whose torch we build against")
endif()

# Without PYTHONPATH and PYTHONNOUSERSITE: under pip's build isolation they hide the environment's own site-packages
# (torch among them) from its interpreter; elsewhere they are rarely set, and torch is found without them.
execute_process(
  COMMAND "${CMAKE_COMMAND}" -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE "${DSCPP_PYTHON}" -c
          "import torch, torch.utils; print(torch.__version__); print(torch.utils.cmake_prefix_path); print(int(torch.compiled_with_cxx11_abi()))"
  RESULT_VARIABLE torch_probe_rc OUTPUT_VARIABLE torch_probe ERROR_VARIABLE torch_probe_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT torch_probe_rc EQUAL 0)
  message(FATAL_ERROR "deepspeed.cpp builds against the PyTorch of a Python interpreter, and DSCPP_PYTHON="
    "'${DSCPP_PYTHON}' cannot import torch:\n${torch_probe_err}\n"
    "Run scripts/setup.sh (it makes .venv with the pinned torch), or activate an environment with torch "
    ">= ${DSCPP_TORCH_MIN}, < ${DSCPP_TORCH_BELOW}, or pass -DDSCPP_PYTHON=/path/to/python.")
endif()
string(REPLACE "\n" ";" torch_probe "${torch_probe}")
list(GET torch_probe 0 DSCPP_TORCH_BUILT_AGAINST)  # torch.__version__, e.g. 2.11.0+cu130: what dscpp imports with
list(GET torch_probe 1 torch_prefix)
list(GET torch_probe 2 torch_cxx11_abi)
string(REGEX REPLACE "\\+.*" "" DSCPP_TORCH_VERSION "${DSCPP_TORCH_BUILT_AGAINST}")  # 2.11.0
if(DSCPP_TORCH_VERSION VERSION_LESS DSCPP_TORCH_MIN OR NOT DSCPP_TORCH_VERSION VERSION_LESS DSCPP_TORCH_BELOW)
  message(FATAL_ERROR "'${DSCPP_PYTHON}' has torch ${DSCPP_TORCH_VERSION}; deepspeed.cpp supports torch "
    ">= ${DSCPP_TORCH_MIN}, < ${DSCPP_TORCH_BELOW} (scripts/setup.sh installs the pinned one into .venv).")
endif()
# The Debian libraries linked beside LibTorch (GoogleTest, protobuf) use the C++11 std::string ABI; a torch built
# with the old one would fail only at the link, on std::string symbols, after minutes of compiling.
if(NOT torch_cxx11_abi EQUAL 1)
  message(FATAL_ERROR "torch ${DSCPP_TORCH_VERSION} of '${DSCPP_PYTHON}' is built with the pre-C++11 std::string "
    "ABI (_GLIBCXX_USE_CXX11_ABI=0); the Debian libraries it links with use the C++11 one.")
endif()

list(APPEND CMAKE_PREFIX_PATH "${torch_prefix}")
find_package(Torch REQUIRED)
message(STATUS "torch ${DSCPP_TORCH_VERSION} from ${DSCPP_PYTHON} (${TORCH_INSTALL_PREFIX})")

# One OpenMP runtime in a process: the wheel's libtorch_cpu brings its own libgomp.so.1 (torch/lib), and our OpenMP
# code (the CPU Adam) links that same file rather than GCC's, which has the same soname and would be shadowed anyway.
if(EXISTS "${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1")
  set(OpenMP_gomp_LIBRARY "${TORCH_INSTALL_PREFIX}/lib/libgomp.so.1" CACHE FILEPATH "torch's OpenMP runtime")
endif()
