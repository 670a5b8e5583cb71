// The one place in src/comm that knows how LibTorch 1.13's c10d differs from 2.x's; the rest of the folder includes
// this header (never c10d's directly) and never tests TORCH_VERSION itself.
#pragma once

// c10d fences its Gloo/NCCL headers with these macros, which its CMake config does not export to users.
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO
#endif
#if defined(DSCPP_WITH_NCCL) && !defined(USE_C10D_NCCL)
#define USE_C10D_NCCL
#endif

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef DSCPP_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "dscpp/compat/torch_compat.h"  // defines: DSCPP_TORCH_AT_LEAST

namespace dscpp::c10d_compat {

// The class ProcessGroupGloo/ProcessGroupNCCL derive from, whose virtual collectives we call. 1.13: they are
// ProcessGroups. 2.0+: they are Backends (a ProcessGroup became a dispatcher over several Backends); the collective
// signatures we use (allreduce, broadcast, allgather, _allgather_base, _reduce_scatter_base, barrier) are the same.
#if DSCPP_TORCH_AT_LEAST(2, 0)
using Group = c10d::Backend;
#else
using Group = c10d::ProcessGroup;
#endif

// SPEC §8 wants the rendezvous port bound to the master address only. c10d's TCPStore server listens on every
// interface (1.13 always: TCPServer calls Socket::listen(port) with no host). Since 2.x TCPStoreOptions can adopt a
// socket we bound ourselves (masterListenFd; honoured by the libuv server, the default since 2.4, from 2.8 on —
// PR 150215), so there we bind to master_addr. KNOWN LIMITATION below 2.8: the store port is open on all
// interfaces of rank 0's host while the job starts; restrict it with a firewall on shared networks.
#if DSCPP_TORCH_AT_LEAST(2, 8)
constexpr bool kStoreAdoptsListenSocket = true;
inline void adopt_listen_socket(c10d::TCPStoreOptions& options, int fd) { options.masterListenFd = fd; }
#else
constexpr bool kStoreAdoptsListenSocket = false;
inline void adopt_listen_socket(c10d::TCPStoreOptions&, int) {}
#endif

}  // namespace dscpp::c10d_compat
