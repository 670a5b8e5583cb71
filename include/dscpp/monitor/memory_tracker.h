// CpuMemoryTracker: the bytes LibTorch holds through its CPU allocator (tensors, and kernels' scratch memory such as
// oneDNN's) now and at most, counted by wrapping that allocator. RSS cannot tell activations from model states or
// from memory malloc keeps after a free; this counts exactly what is held, so "how much did this forward and
// backward need" has an answer on a machine without a GPU (where the CUDA caching allocator keeps such statistics).
#pragma once

#include <cstdint>

namespace dscpp {

class CpuMemoryTracker {
 public:
  // Puts the counting allocator in front of LibTorch's CPU allocator, once per process (later calls do nothing).
  // Only tensors allocated after the first call are counted.
  static void install();
  static bool installed();

  static int64_t allocated();   // bytes held by counted CPU tensors now
  static int64_t peak();        // the most held at once since install or the last reset_peak
  static void reset_peak();     // peak = allocated now
};

}  // namespace dscpp
