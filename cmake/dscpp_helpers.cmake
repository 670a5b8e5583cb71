# Helpers shared by every CMakeLists: warnings, and one precompiled LibTorch header reused by all torch targets
# (a LibTorch translation unit costs ~15 s to parse; the PCH is what keeps CI's build short).

set(DSCPP_WARNINGS -Wall -Wextra -Wno-unused-parameter)

# The PCH owner: every torch target reuses its precompiled header instead of parsing <torch/torch.h> again.
function(dscpp_make_pch_target)
  add_library(dscpp_torch_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/pch/torch_pch.cpp)
  target_link_libraries(dscpp_torch_pch PUBLIC ${TORCH_LIBRARIES})
  target_compile_options(dscpp_torch_pch PRIVATE ${DSCPP_WARNINGS})
  target_precompile_headers(dscpp_torch_pch PRIVATE ${PROJECT_SOURCE_DIR}/cmake/pch/torch_pch.h)
endfunction()

# dscpp_unity_build(TARGET): the target's sources compiled in batches when DSCPP_UNITY_BUILD is on (CMakeLists.txt).
function(dscpp_unity_build target)
  set_target_properties(${target} PROPERTIES UNITY_BUILD ${DSCPP_UNITY_BUILD} UNITY_BUILD_BATCH_SIZE 8)
endfunction()

# dscpp_library(NAME SOURCES... [TORCH] [DEPS libs...]): one layer of the engine, one folder of src/.
function(dscpp_library name)
  cmake_parse_arguments(ARG "TORCH" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  add_library(dscpp::${name} ALIAS ${name})
  dscpp_unity_build(${name})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:include>)
  target_compile_options(${name} PRIVATE ${DSCPP_WARNINGS})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  if(ARG_TORCH)
    target_link_libraries(${name} PUBLIC ${TORCH_LIBRARIES})
    target_precompile_headers(${name} REUSE_FROM dscpp_torch_pch)
  endif()
  set_property(GLOBAL APPEND PROPERTY DSCPP_LIBRARIES ${name})
endfunction()

# dscpp_torch_executable(NAME SOURCES...): an executable that includes LibTorch, with the shared PCH.
function(dscpp_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM dscpp_torch_pch)
  target_compile_options(${target} PRIVATE ${DSCPP_WARNINGS})
endfunction()
