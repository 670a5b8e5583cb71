// c10d's headers, for src/comm only (the rest of the project never sees c10d). Version differences are not here:
// they live in dscpp/compat/torch_compat.h with the rest.
#pragma once

// c10d fences its Gloo/NCCL headers with these macros, which its CMake config does not export to users.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#if defined(DSCPP_WITH_NCCL) && !defined(USE_C10D_NCCL)
#define USE_C10D_NCCL
#endif

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef DSCPP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "dscpp/compat/torch_compat.h"
