// Private to src/onebit: the 1-bit optimizers' option checks and each one's constructor function (their shared state
// and arithmetic: compressed_adam.h; the chunked loop, scratch and option check of every flat optimizer:
// dscpp/optim/update_helpers.h).
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>

#include "dscpp/comm/comm.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/optim/options.h"
#include "dscpp/optim/update_helpers.h"

namespace dscpp::onebit {

using detail::require;

// The Adam settings both take: lr, betas, eps and weight decay, each in DeepSpeed's range.
inline void check_adam_options(double lr, const std::array<double, 2>& betas, double eps, double weight_decay) {
  require(lr >= 0.0, "lr", "must be >= 0", lr);
  require(betas[0] >= 0.0 && betas[0] < 1.0, "betas[0]", "must be in [0, 1)", betas[0]);
  require(betas[1] >= 0.0 && betas[1] < 1.0, "betas[1]", "must be in [0, 1)", betas[1]);
  require(eps > 0.0, "eps", "must be > 0", eps);
  require(weight_decay >= 0.0, "weight_decay", "must be >= 0", weight_decay);
}

// The three optimizers (onebit_adam.cpp, zero_one_adam.cpp, onebit_lamb.cpp), options checked there;
// `state_options` already fp32.
std::unique_ptr<FlatOptimizer> make_onebit_adam(const OneBitAdamOptions& options, int64_t numel,
                                                const torch::TensorOptions& state_options, std::shared_ptr<Comm> comm);
std::unique_ptr<FlatOptimizer> make_zero_one_adam(const ZeroOneAdamOptions& options, int64_t numel,
                                                  const torch::TensorOptions& state_options,
                                                  std::shared_ptr<Comm> comm);
std::unique_ptr<FlatOptimizer> make_onebit_lamb(const OneBitLambOptions& options, int64_t numel,
                                                const torch::TensorOptions& state_options, std::shared_ptr<Comm> comm);

}  // namespace dscpp::onebit
