// defines: tune_host_malloc — glibc's malloc thresholds for a training process, set once by dscpp::initialize.
// A training step frees and allocates the same activation-sized blocks every step. glibc's adaptive policy returns
// blocks above its mmap threshold to the kernel on free and trims the heap top above its trim threshold, both tied to
// the sizes it has seen so far, so each step faults the same pages in again and the kernel zeroes them. Fixing the
// thresholds where glibc's own adaptation stops (mmap 32 MiB, trim 64 MiB) keeps those blocks for reuse
// (bench/host_malloc; docs/performance.md).
#pragma once

#include <cstddef>
#include <string>

namespace dscpp {

struct HostMallocTuning {
  bool applied = false;
  std::string reason;  // why not, when not applied
};

// Blocks up to this size come from the heap and are reused; larger ones are mapped and unmapped (glibc's maximum).
constexpr size_t kMallocMmapThreshold = size_t{32} << 20;
// The heap's free top is returned to the kernel only above this (twice the mmap threshold, as glibc pairs them).
constexpr size_t kMallocTrimThreshold = size_t{64} << 20;

// Sets both thresholds through mallopt, once per process; later calls return the first call's result. Leaves malloc
// as it is with DSCPP_MALLOC_TUNING=0 (glibc's own adaptive policy), where the environment already tunes it
// (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_ or glibc.malloc in GLIBC_TUNABLES), or where the C
// library is not glibc.
HostMallocTuning tune_host_malloc();

}  // namespace dscpp
