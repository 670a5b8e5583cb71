// The counting CPU allocator: each allocation's DataPtr carries a small record of its size and the wrapped
// allocator's own DataPtr; freeing the record subtracts the size and then frees the memory through the original.
#include "dscpp/monitor/memory_tracker.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "dscpp/compat/torch_compat.h"

namespace dscpp {
namespace {

std::atomic<int64_t> g_allocated{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};

struct Allocation {
  c10::DataPtr inner;
  int64_t bytes;
};

void free_counted(void* ctx) {
  auto* allocation = static_cast<Allocation*>(ctx);
  g_allocated.fetch_sub(allocation->bytes, std::memory_order_relaxed);
  delete allocation;  // frees the memory through the wrapped allocator's deleter
}

class CountingAllocator final : public compat::WrappingAllocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr wrapped_allocate(size_t n) const override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    const auto device = inner.device();
    const auto bytes = static_cast<int64_t>(n);
    const int64_t now = g_allocated.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return {data, new Allocation{std::move(inner), bytes}, &free_counted, device};
  }

  // No raw deleter: a bare pointer does not say how many bytes to uncount, so raw_allocate is not offered.
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }

 private:
  c10::Allocator* inner_;
};

}  // namespace

void CpuMemoryTracker::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Lives as long as the process: storages made after this keep a pointer to it.
    static CountingAllocator allocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(&allocator, /*priority=*/100);
    g_installed = true;
  });
}

bool CpuMemoryTracker::installed() { return g_installed; }
int64_t CpuMemoryTracker::allocated() { return g_allocated.load(std::memory_order_relaxed); }
int64_t CpuMemoryTracker::peak() { return std::max(g_peak.load(std::memory_order_relaxed), allocated()); }
void CpuMemoryTracker::reset_peak() { g_peak.store(allocated(), std::memory_order_relaxed); }

}  // namespace dscpp
