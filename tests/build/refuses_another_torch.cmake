# cmake -DSOURCE=<repository> -DWORK=<scratch dir> -P refuses_another_torch.cmake
# Configures the repository with DSCPP_PYTHON a shell script that prints what cmake/dscpp_torch.cmake's probe reads
# (torch.__version__, cmake prefix, C++11 ABI) for torch 2.10.0, and fails unless the configure stops
# with the message that names both versions.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
file(WRITE ${WORK}/python "#!/bin/sh\nprintf '2.10.0+cpu\\n/nonexistent\\n1\\n'\n")
file(CHMOD ${WORK}/python PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE)
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE} -B ${WORK}/build -DDSCPP_PYTHON=${WORK}/python
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  message(FATAL_ERROR "the configure accepted torch 2.10.0:\n${out}\n${err}")
endif()
# CMake wraps a message's words over lines: compare with the whitespace made single spaces.
string(REGEX REPLACE "[ \t\n]+" " " said "${err}")
set(want "'${WORK}/python' has torch 2.10.0; deepspeed.cpp supports torch >= 2.11, < 2.12")
string(FIND "${said}" "${want}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the configure stopped without naming both versions (wanted: ${want}):\n${err}")
endif()
message(STATUS "refused: ${want}")
