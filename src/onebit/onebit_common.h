// Private to src/onebit: what the 1-bit optimizers share — their option checks, their bounded scratch, Adam's update
// direction as DeepSpeed's 1-bit optimizers compute it, op for op — and each one's constructor function.
#pragma once

#include <torch/torch.h>

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

// out = m / (√v + ε), then out += wd·p (`decay` is scratch for wd·p): DeepSpeed's `update` before it is scaled by
// −lr. Every argument one chunk of the same length.
inline void adam_direction(torch::Tensor& out, const torch::Tensor& m, const torch::Tensor& v, const torch::Tensor& p,
                           double eps, double weight_decay, torch::Tensor& decay_buffer) {
  torch::sqrt_out(out, v);
  out.add_(eps);
  torch::div_out(out, m, out);
  if (weight_decay > 0.0) {
    auto decay = scratch(decay_buffer, out.numel(), p);
    torch::mul_out(decay, p, weight_decay);
    out.add_(decay);
  }
}

// The two optimizers (onebit_adam.cpp, zero_one_adam.cpp), options checked there; `state_options` already fp32.
std::unique_ptr<FlatOptimizer> make_onebit_adam(const OneBitAdamOptions& options, int64_t numel,
                                                const torch::TensorOptions& state_options, std::shared_ptr<Comm> comm);
std::unique_ptr<FlatOptimizer> make_zero_one_adam(const ZeroOneAdamOptions& options, int64_t numel,
                                                  const torch::TensorOptions& state_options,
                                                  std::shared_ptr<Comm> comm);

}  // namespace dscpp::onebit
