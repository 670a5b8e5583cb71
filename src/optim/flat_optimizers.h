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

// A scratch buffer of one chunk (or the whole partition when it is smaller).
inline torch::Tensor make_scratch(int64_t numel, const torch::TensorOptions& options) {
  return torch::empty({std::min(numel, kChunkElements)}, options);
}

// Throws std::invalid_argument "optimizer.params.<key> <requirement>, got <value>" unless `ok`.
template <typename T>
void require(bool ok, const char* key, const char* requirement, T value) {
  if (ok) return;
  std::ostringstream msg;
  msg << "optimizer.params." << key << ' ' << requirement << ", got " << value;
  throw std::invalid_argument(msg.str());
}

// The engine's contract with step(): 1-D fp32 tensors of the partition's size. Cheap (no data access).
void check_step_args(const torch::Tensor& param, const torch::Tensor& grad, int64_t numel, const std::string& name);

std::unique_ptr<FlatOptimizer> make_flat_adam(const AdamOptions& options, bool decoupled, const std::string& name,
                                              int64_t numel, const torch::TensorOptions& state_options);
std::unique_ptr<FlatOptimizer> make_flat_sgd(const SgdOptions& options, int64_t numel,
                                             const torch::TensorOptions& state_options);
std::unique_ptr<FlatOptimizer> make_flat_lion(const LionOptions& options, int64_t numel,
                                              const torch::TensorOptions& state_options);
std::unique_ptr<FlatOptimizer> make_flat_adagrad(const AdagradOptions& options, int64_t numel,
                                                 const torch::TensorOptions& state_options);

}  // namespace dscpp::detail
