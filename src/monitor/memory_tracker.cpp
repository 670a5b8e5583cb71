// The counting CPU allocator. It keeps the default CPU allocator's contract, because LibTorch relies on it: every
// DataPtr's context is its data pointer and raw_deleter() frees given that pointer alone — oneDNN's scratch memory
// (bf16 matmuls on AVX-512 CPUs, among others) comes through raw_allocate / raw_deallocate, which assert exactly that.
// So the size of a live allocation cannot ride in its context; it is kept in a table keyed by the data pointer,
// beside the wrapped allocator's own DataPtr (how c10's ProfiledCPUMemoryReporter keeps sizes too).
#include "dscpp/monitor/memory_tracker.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>


namespace dscpp {
namespace {

void free_counted(void* data);

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    const auto device = inner.device();
    // Nothing to count or free (the default allocator's answer to 0 bytes); `inner` lets go of whatever it holds.
    if (data == nullptr) return {nullptr, nullptr, &free_counted, device};
    const auto bytes = static_cast<int64_t>(n);
    bool inserted = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      inserted = live_.emplace(data, Live{std::move(inner), bytes}).second;
    }
    // An address is never live twice: release() erases a pointer before its memory is freed.
    TORCH_INTERNAL_ASSERT(inserted, "CpuMemoryTracker: the CPU allocator returned an address that is still live");
    const int64_t now = allocated_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return {data, data, &free_counted, device};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_counted; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  // Uncounts `data` and frees it through the wrapped allocator. A pointer not in the table was raw_allocate'd before
  // install (a DataPtr made then keeps its own deleter): it goes to the wrapped allocator's raw deleter, the one
  // raw_deallocate would have called before install.
  void release(void* data) const {
    decltype(live_)::node_type live;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live = live_.extract(data);
    }
    if (live.empty()) {
      if (const auto deleter = inner_->raw_deleter()) deleter(data);
      return;
    }
    allocated_.fetch_sub(live.mapped().bytes, std::memory_order_relaxed);
    // `live` frees the memory, then its own node, as it goes out of scope outside the lock.
  }

  int64_t allocated() const { return allocated_.load(std::memory_order_relaxed); }
  int64_t peak() const { return std::max(peak_.load(std::memory_order_relaxed), allocated()); }
  void reset_peak() const { peak_.store(allocated(), std::memory_order_relaxed); }

 private:
  struct Live {
    c10::DataPtr inner;  // the wrapped allocator's allocation; destroying it frees the memory
    int64_t bytes;       // as asked for, so the count is exactly what tensors hold
  };

  c10::Allocator* inner_;
  // mutable: release() and reset_peak() are const, as the free functions above hold the allocator by const pointer.
  mutable std::mutex mutex_;
  mutable std::unordered_map<void*, Live> live_;
  mutable std::atomic<int64_t> allocated_{0};
  mutable std::atomic<int64_t> peak_{0};
};

// The one instance, made by install() and never destroyed (storages made after it keep a pointer to it). A global
// because the deleter is a plain function that is given the data pointer and nothing else.
std::atomic<CountingAllocator*> g_allocator{nullptr};

void free_counted(void* data) {
  if (data == nullptr) return;
  g_allocator.load(std::memory_order_acquire)->release(data);
}

}  // namespace

void CpuMemoryTracker::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Leaked on purpose: LibTorch's own statics (caches holding tensors, oneDNN's scratch) free through it at exit,
    // after the destructors of this file's statics would have run.
    auto* allocator = new CountingAllocator(c10::GetCPUAllocator());
    g_allocator.store(allocator, std::memory_order_release);
    c10::SetCPUAllocator(allocator, /*priority=*/100);
  });
}

bool CpuMemoryTracker::installed() { return g_allocator.load(std::memory_order_acquire) != nullptr; }

int64_t CpuMemoryTracker::allocated() {
  const auto* allocator = g_allocator.load(std::memory_order_acquire);
  return allocator ? allocator->allocated() : 0;
}

int64_t CpuMemoryTracker::peak() {
  const auto* allocator = g_allocator.load(std::memory_order_acquire);
  return allocator ? allocator->peak() : 0;
}

void CpuMemoryTracker::reset_peak() {
  if (const auto* allocator = g_allocator.load(std::memory_order_acquire)) allocator->reset_peak();
}

}  // namespace dscpp
