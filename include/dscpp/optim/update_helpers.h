// What a flat optimizer's update() uses beside its arithmetic: the chunked loop that bounds its scratch, the scratch
// buffer itself, and the option check that names "optimizer.params.<key>". Shared by src/optim's optimizers and the
// 1-bit optimizers of src/onebit.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <stdexcept>

namespace dscpp::detail {

// Updates run over the partition in pieces of at most this many elements, so the scratch buffers some
// updates need (Adam's denominator, an L2-decayed gradient) stay bounded (16 MiB of fp32) instead of adding
// 4 bytes per parameter to the model state, and no step allocates.
constexpr int64_t kChunkElements = int64_t{1} << 22;

// Calls fn(offset, length) for consecutive pieces covering [0, numel).
template <typename Fn>
void for_each_chunk(int64_t numel, Fn&& fn) {
  for (int64_t offset = 0; offset < numel; offset += kChunkElements) {
    fn(offset, std::min(kChunkElements, numel - offset));
  }
}

// A scratch buffer of at most one chunk, allocated at the first update that needs it and kept: the optimizer's
// own partition, or the slices offload hands it, never need more.
class Scratch {
 public:
  torch::Tensor get(int64_t length, const torch::Tensor& like) {
    if (!buffer_.defined() || buffer_.numel() < length || buffer_.device() != like.device()) {
      buffer_ = torch::empty({std::min(std::max(length, buffer_.defined() ? buffer_.numel() : 0), kChunkElements)},
                             like.options());
    }
    return buffer_.narrow(0, 0, length);
  }

 private:
  torch::Tensor buffer_;
};

// Throws std::invalid_argument "optimizer.params.<key> <requirement>, got <value>" unless `ok`.
template <typename T>
void require(bool ok, const char* key, const char* requirement, T value) {
  if (ok) return;
  std::ostringstream msg;
  msg << "optimizer.params." << key << ' ' << requirement << ", got " << value;
  throw std::invalid_argument(msg.str());
}

}  // namespace dscpp::detail
