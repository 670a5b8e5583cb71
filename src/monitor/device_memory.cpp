// DeviceMemoryCounter over c10's DeviceAllocator: the caching allocator's aggregate "allocated_bytes" statistic (all
// pools), the one torch.cuda.max_memory_allocated reports.
#include "dscpp/monitor/device_memory.h"

#include <c10/core/CachingDeviceAllocator.h>

#include <stdexcept>

namespace dscpp {
namespace {

const c10::CachingAllocator::Stat& allocated_stat(const c10::CachingDeviceAllocator::DeviceStats& stats) {
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
}

}  // namespace

DeviceMemoryCounter::DeviceMemoryCounter(const torch::Device& device) : device_(device) {
  if (device.is_cpu()) throw std::invalid_argument("DeviceMemoryCounter: the CPU's counter is CpuMemoryTracker");
}

int64_t DeviceMemoryCounter::allocated() const {
  return allocated_stat(c10::getDeviceAllocator(device_.type())->getDeviceStats(device_.index())).current;
}

int64_t DeviceMemoryCounter::peak() const {
  return allocated_stat(c10::getDeviceAllocator(device_.type())->getDeviceStats(device_.index())).peak;
}

void DeviceMemoryCounter::reset_peak() { c10::getDeviceAllocator(device_.type())->resetPeakStats(device_.index()); }

}  // namespace dscpp
