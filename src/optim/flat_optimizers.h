// Private to src/optim: one constructor function per flat optimizer (the factory in flat_optimizer.cpp picks
// one), and the slice checks they share (the chunked loop, scratch and option checks: dscpp/optim/update_helpers.h).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/optim/update_helpers.h"
#include "dscpp/optim/options.h"

namespace dscpp::detail {

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
std::unique_ptr<FlatOptimizer> make_flat_lamb(const LambOptions& options, int64_t numel,
                                              const torch::TensorOptions& state_options);

}  // namespace dscpp::detail
