// tune_host_malloc: see the header for why; this file only decides whether to and calls mallopt.
#include "dscpp/engine/host_malloc.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace dscpp {
namespace {

HostMallocTuning tune_once() {
  const char* opt_out = std::getenv("DSCPP_MALLOC_TUNING");
  if (opt_out && std::strcmp(opt_out, "0") == 0) return {false, "DSCPP_MALLOC_TUNING=0"};
#if defined(__GLIBC__)
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"}) {
    if (std::getenv(name)) return {false, std::string(name) + " is set: malloc is left as the environment tunes it"};
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.")) {
    return {false, "GLIBC_TUNABLES sets glibc.malloc: malloc is left as the environment tunes it"};
  }
  // The mmap threshold first: it is the one glibc may refuse, and a trim threshold set alone would turn the
  // adaptation off with the mmap threshold left at its 128 KiB start, mapping every activation afresh.
  if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kMallocMmapThreshold)) != 1) {
    return {false, "mallopt refused M_MMAP_THRESHOLD"};
  }
  if (mallopt(M_TRIM_THRESHOLD, static_cast<int>(kMallocTrimThreshold)) != 1) {
    return {false, "mallopt refused M_TRIM_THRESHOLD"};
  }
  return {true, ""};
#else
  return {false, "the C library is not glibc"};
#endif
}

}  // namespace

HostMallocTuning tune_host_malloc() {
  static std::once_flag once;
  static HostMallocTuning result;
  std::call_once(once, [] { result = tune_once(); });
  return result;
}

}  // namespace dscpp
