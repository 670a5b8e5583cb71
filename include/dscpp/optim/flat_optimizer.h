// FlatOptimizer: an optimizer that updates one contiguous fp32 buffer (this rank's partition of the master
// weights) from a gradient buffer of the same size. Every ZeRO stage hands it a flat partition, so the optimizer
// never sees module structure, and its state is flat tensors that shard and checkpoint trivially.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/optim/options.h"

namespace dscpp {

class FlatOptimizer {
 public:
  virtual ~FlatOptimizer() = default;

  // One update. `param` and `grad` are 1-D fp32 tensors of the size given at construction, on the same device.
  // `grad` is already averaged over ranks, unscaled and clipped; the optimizer may not modify it.
  virtual void step(torch::Tensor& param, const torch::Tensor& grad, double lr) = 0;

  // Sets beta1 (Adam, Lion) or momentum (SGD) for schedules that cycle momentum (OneCycle). No-op where
  // the optimizer has none.
  virtual void set_momentum(double momentum) { (void)momentum; }

  // Named state buffers, each a 1-D tensor the size of the partition ("exp_avg", "exp_avg_sq", ...).
  // Returned tensors alias the optimizer's storage: loading a checkpoint copies into them.
  virtual std::vector<std::pair<std::string, torch::Tensor>> state_tensors() = 0;

  // Number of updates taken (Adam's bias-correction step).
  virtual int64_t step_count() const = 0;
  virtual void set_step_count(int64_t steps) = 0;

  virtual std::string name() const = 0;
};

// Builds the optimizer for a partition of `numel` elements. State is allocated with `options` (fp32, device).
// Throws std::invalid_argument naming the option for values the optimizer cannot use
// (e.g. "optimizer.params.nesterov requires momentum > 0").
std::unique_ptr<FlatOptimizer> make_flat_optimizer(const OptimizerConfig& config, int64_t numel,
                                                   const torch::TensorOptions& options);

}  // namespace dscpp
