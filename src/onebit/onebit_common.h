// Private to src/onebit: the 1-bit optimizers' option checks and bounded scratch, and each one's constructor function
// (their shared state and arithmetic: compressed_adam.h).
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "dscpp/comm/comm.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/optim/options.h"

namespace dscpp::onebit {

// The partition is updated in pieces of this many elements, so the scratch buffers stay bounded (16 MiB of fp32).
constexpr int64_t kChunk = int64_t{1} << 22;

// std::invalid_argument "optimizer.params.<key> <requirement>, got <value>" unless `ok`.
inline void require(bool ok, const char* key, const char* requirement, double value) {
  if (!ok) {
    throw std::invalid_argument(std::string("optimizer.params.") + key + " " + requirement + ", got " +
                                std::to_string(value));
  }
}

// `length` elements of `buffer`, (re)allocated like `like` when too small.
inline torch::Tensor scratch(torch::Tensor& buffer, int64_t length, const torch::Tensor& like) {
  if (!buffer.defined() || buffer.numel() < length || buffer.device() != like.device()) {
    buffer = torch::empty({length}, like.options());
  }
  return buffer.narrow(0, 0, length);
}

// The Adam settings both take: lr, betas, eps and weight decay, each in DeepSpeed's range.
inline void check_adam_options(double lr, const std::array<double, 2>& betas, double eps, double weight_decay) {
  require(lr >= 0.0, "lr", "must be >= 0", lr);
  require(betas[0] >= 0.0 && betas[0] < 1.0, "betas[0]", "must be in [0, 1)", betas[0]);
  require(betas[1] >= 0.0 && betas[1] < 1.0, "betas[1]", "must be in [0, 1)", betas[1]);
  require(eps > 0.0, "eps", "must be > 0", eps);
  require(weight_decay >= 0.0, "weight_decay", "must be >= 0", weight_decay);
}

// The two optimizers (onebit_adam.cpp, zero_one_adam.cpp), options checked there; `state_options` already fp32.
std::unique_ptr<FlatOptimizer> make_onebit_adam(const OneBitAdamOptions& options, int64_t numel,
                                                const torch::TensorOptions& state_options, std::shared_ptr<Comm> comm);
std::unique_ptr<FlatOptimizer> make_zero_one_adam(const ZeroOneAdamOptions& options, int64_t numel,
                                                  const torch::TensorOptions& state_options,
                                                  std::shared_ptr<Comm> comm);

}  // namespace dscpp::onebit
