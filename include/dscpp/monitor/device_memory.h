// DeviceMemoryCounter: what an accelerator's caching allocator (CUDA's, through torch's device-generic
// DeviceAllocator interface: no CUDA headers here) holds for tensors now and at most, for memory_breakdown's
// activation figure on a GPU, as CpuMemoryTracker gives it on the CPU. torch keeps these statistics itself; this only
// reads and resets them for one device.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace dscpp {

class DeviceMemoryCounter {
 public:
  // `device` must not be the CPU (std::invalid_argument): its counter is CpuMemoryTracker.
  explicit DeviceMemoryCounter(const torch::Device& device);

  int64_t allocated() const;  // bytes held by tensors on the device now
  int64_t peak() const;       // the most held at once since the last reset_peak (or the process started)
  void reset_peak();          // peak = allocated now

 private:
  torch::Device device_;
};

}  // namespace dscpp
