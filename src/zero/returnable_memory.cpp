// Returnable memory: anonymous mappings on the CPU, recycled through a small cache; the device allocator elsewhere.
#include "dscpp/zero/returnable_memory.h"

#include <sys/mman.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "dscpp/compat/torch_compat.h"

namespace dscpp {
namespace {

struct Mapping {
  void* address;
  size_t length;
};

// Freed mappings kept for the next buffer of the same length. ZeRO-3 frees a block's buffer and needs one of the
// same size again a moment later; mapping afresh each time faults every page in again (bench/zero3_overhead went
// from 1.0x to 1.3x of ZeRO-2's step time that way). A new mapping is made only when no idle one fits, so the
// cache never holds more than was once in use at the same time, and it keeps at most kIdle of them.
class MappingCache {
 public:
  static constexpr size_t kIdle = 4;

  // A mapping of `length` bytes; `zeroed` tells whether it is known to be all zeros (a fresh one is).
  Mapping take(size_t length, bool& zeroed) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (size_t i = 0; i < idle_.size(); ++i) {
        if (idle_[i].length != length) continue;
        const Mapping m = idle_[i];
        idle_.erase(idle_.begin() + static_cast<std::ptrdiff_t>(i));
        zeroed = false;
        return m;
      }
    }
    void* address = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (address == MAP_FAILED) throw std::bad_alloc();
    zeroed = true;  // anonymous private pages read as zero until written
    return {address, length};
  }

  // Called from DataPtr deleters, on whichever thread drops the last reference.
  void give_back(const Mapping& m) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (idle_.size() < kIdle) {
        idle_.push_back(m);
        return;
      }
    }
    ::munmap(m.address, m.length);
  }

 private:
  std::mutex mutex_;
  std::vector<Mapping> idle_;
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
  const Mapping m = cache().take(nbytes == 0 ? 1 : nbytes, zeroed);
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
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

}  // namespace dscpp
