// Returnable memory: anonymous mappings on the CPU, recycled through a small cache; the device allocator elsewhere.
#include "dscpp/zero/returnable_memory.h"

#include <sys/mman.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "dscpp/compat/torch_compat.h"

namespace dscpp {
namespace {

struct Mapping {
  void* address;
  size_t length;  // whole pages
};

// Freed mappings kept for the next buffer of the same length. ZeRO-3 frees a block's buffer and needs one of the
// same size again a moment later; mapping afresh each time faults every page in again (bench/zero3_overhead went
// from 1.0x to 1.3x of ZeRO-2's step time that way). The bound is in bytes, not a count: idle and in-use mappings
// together never exceed the most that was once in use at the same time, so the cache costs no memory beyond the
// peak the process reached anyway. (A count of 4 thrashed on per-Linear units: Python's GPT frees a dozen
// buffers of three lengths per step, and 36 of them a step were unmapped and faulted in again.) Lengths are whole
// pages, so buffers that differ by less than a page share mappings.
class MappingCache {
 public:
  // A mapping of at least `length` bytes; `zeroed` tells whether it is known to be all zeros (a fresh one is).
  Mapping take(size_t length, bool& zeroed) {
    length = whole_pages(length);
    std::vector<Mapping> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // The most recently freed one first: its pages are the likeliest to be in the cache.
      for (size_t i = idle_.size(); i-- > 0;) {
        if (idle_[i].length != length) continue;
        const Mapping m = idle_[i];
        idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
        idle_bytes_ -= length;
        in_use_bytes_ += length;
        zeroed = false;
        return m;
      }
      in_use_bytes_ += length;
      peak_bytes_ = std::max(peak_bytes_, in_use_bytes_);
      // Oldest first, until idle and in use fit under the peak again.
      size_t drop = 0;
      while (drop < idle_.size() && idle_bytes_ + in_use_bytes_ > peak_bytes_) idle_bytes_ -= idle_[drop++].length;
      evicted.assign(idle_.begin(), idle_.begin() + static_cast<std::ptrdiff_t>(drop));
      idle_.erase(idle_.begin(), idle_.begin() + static_cast<std::ptrdiff_t>(drop));
    }
    for (const auto& m : evicted) ::munmap(m.address, m.length);
    void* address = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (address == MAP_FAILED) {
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_bytes_ -= length;
      throw std::bad_alloc();
    }
    zeroed = true;  // anonymous private pages read as zero until written
    return {address, length};
  }

  // Called from DataPtr deleters, on whichever thread drops the last reference.
  void give_back(const Mapping& m) {
    std::lock_guard<std::mutex> lock(mutex_);
    in_use_bytes_ -= m.length;
    idle_bytes_ += m.length;
    idle_.push_back(m);
  }

  // Unmaps every idle mapping (trim_heap: after one-time phases whose buffers will not come back).
  void drop_idle() {
    std::vector<Mapping> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      evicted.swap(idle_);
      idle_bytes_ = 0;
      peak_bytes_ = in_use_bytes_;  // what the phase needed says nothing about what comes next
    }
    for (const auto& m : evicted) ::munmap(m.address, m.length);
  }

 private:
  static size_t whole_pages(size_t length) {
    static const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    return (std::max<size_t>(length, 1) + page - 1) / page * page;
  }

  std::mutex mutex_;
  std::vector<Mapping> idle_;  // oldest first
  size_t idle_bytes_ = 0;
  size_t in_use_bytes_ = 0;
  size_t peak_bytes_ = 0;
};

MappingCache& cache() {
  static auto* instance = new MappingCache();  // never destroyed: deleters may run during static destruction
  return *instance;
}

void release(void* context) {
  auto* mapping = static_cast<Mapping*>(context);
  cache().give_back(*mapping);
  delete mapping;
}

c10::DataPtr map(size_t nbytes, bool zero) {
  bool zeroed = false;
  const Mapping m = cache().take(nbytes, zeroed);
  if (zero && !zeroed) std::memset(m.address, 0, m.length);
  return c10::DataPtr(m.address, new Mapping(m), &release, c10::Device(c10::kCPU));
}

}  // namespace

torch::Tensor returnable_zeros(int64_t numel, const torch::TensorOptions& options) {
  if (options.device().type() != c10::kCPU) return torch::zeros({numel}, options);
  auto tensor = torch::empty({0}, options);
  const size_t nbytes = static_cast<size_t>(numel) * tensor.element_size();
  auto* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(map(nbytes, /*zero=*/true));
  storage->set_nbytes(nbytes);
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
  return tensor;
}

void allocate_returnable(const torch::Tensor& tensor, size_t nbytes) {
  if (tensor.device().type() != c10::kCPU) {
    compat::allocate_storage(tensor, nbytes);
    return;
  }
  auto* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(map(nbytes, /*zero=*/false));
  storage->set_nbytes(nbytes);
}

void trim_heap() {
  cache().drop_idle();
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace dscpp
