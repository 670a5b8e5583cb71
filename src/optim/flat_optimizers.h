// Private to src/optim: one constructor function per flat optimizer (the factory in flat_optimizer.cpp picks
// one), plus the argument checks and the chunked loop they share.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/optim/options.h"

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

// The contract of update(): 1-D fp32 tensors of one length on one device, one state slice per state kind. Cheap
// (no data access).
void check_slice(const OptimizerSlice& slice, size_t state_count, const std::string& name);

// Writes the slice's updated parameters into its 16-bit copy, when it asks for one.
inline void write_param16(const OptimizerSlice& slice) {
  if (slice.param16.defined()) slice.param16.copy_(slice.param);
}

std::unique_ptr<FlatOptimizer> make_flat_adam(const AdamOptions& options, bool decoupled, const std::string& name,
                                              int64_t numel, const torch::TensorOptions& state_options,
                                              OptimizerKernels kernels);
std::unique_ptr<FlatOptimizer> make_flat_sgd(const SgdOptions& options, int64_t numel,
                                             const torch::TensorOptions& state_options);
std::unique_ptr<FlatOptimizer> make_flat_lion(const LionOptions& options, int64_t numel,
                                              const torch::TensorOptions& state_options);
std::unique_ptr<FlatOptimizer> make_flat_adagrad(const AdagradOptions& options, int64_t numel,
                                                 const torch::TensorOptions& state_options);

}  // namespace dscpp::detail
