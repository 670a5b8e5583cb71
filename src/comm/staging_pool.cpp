// StagingPool: see the header for why it exists.
#include "staging_pool.h"

#include <algorithm>

namespace dscpp {

at::Tensor StagingPool::take(int64_t numel, torch::ScalarType dtype, const torch::Device& device) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The smallest free buffer that fits: a small collective does not pin the largest buffer.
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->scalar_type() != dtype || it->device() != device || it->numel() < numel) continue;
      if (best == free_.end() || it->numel() < best->numel()) best = it;
    }
    if (best != free_.end()) {
      at::Tensor buffer = std::move(*best);
      free_.erase(best);
      return buffer.narrow(0, 0, numel);
    }
  }
  return torch::empty({numel}, torch::TensorOptions().dtype(dtype).device(device));
}

void StagingPool::give_back(const at::Tensor& buffer) {
  // A narrowed view shares its storage with the whole buffer: keep the whole one.
  const int64_t whole = static_cast<int64_t>(buffer.storage().nbytes() / buffer.element_size());
  at::Tensor flat = torch::empty({0}, buffer.options()).set_(buffer.storage(), 0, {whole}, {1});
  std::lock_guard<std::mutex> lock(mutex_);
  free_.push_back(std::move(flat));
  if (free_.size() > kMaxFree) {
    auto smallest = std::min_element(free_.begin(), free_.end(),
                                      [](const at::Tensor& a, const at::Tensor& b) { return a.numel() < b.numel(); });
    free_.erase(smallest);
  }
}

int64_t StagingPool::free_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bytes = 0;
  for (const auto& b : free_) bytes += b.numel() * b.element_size();
  return bytes;
}

}  // namespace dscpp
