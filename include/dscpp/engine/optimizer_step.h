// OptimizerStep: where the optimizer's update runs, chosen once when the engine is assembled — offload_optimizer
// is this choice, not a flag the step asks. In place: the optimizer updates the master partition where the stage
// keeps it, then the stage publishes the parameters. Offloaded: OptimizerOffload updates it on the host sub-group by
// sub-group, publishing each as soon as it is done.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "dscpp/offload/optimizer_offload.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

class OptimizerStep {
 public:
  virtual ~OptimizerStep() = default;
  // `grads`: the master gradient partition, averaged, unscaled and clipped; `lr`: this step's. Returns with the
  // parameters published.
  virtual void run(const torch::Tensor& grads, double lr) = 0;
  // offload_optimizer: what holds the master and the optimizer state (checkpoints read and write through it);
  // null in place.
  virtual OptimizerOffload* offload() { return nullptr; }
};

// `optimizer` and `stage` outlive the step.
std::unique_ptr<OptimizerStep> make_in_place_step(FlatOptimizer& optimizer, ZeroStage& stage);
std::unique_ptr<OptimizerStep> make_offloaded_step(std::unique_ptr<OptimizerOffload> offload);

}  // namespace dscpp
