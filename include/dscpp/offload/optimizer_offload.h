// OptimizerOffload: ZeRO-Offload's optimizer step. The fp32 master partition and the optimizer state
// are in a StateStore (host memory, or NVMe), the gradient partition is in host memory (the stage moved each bucket
// there as it was reduced), and the step runs on the CPU one sub-group at a time: the SIMD CPU Adam updates the
// sub-group and writes its compute-dtype copy in the same pass, the copy goes to the stage at once
// (ZeroStage::publish_range), whose all-gather then runs while the next sub-group steps.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "dscpp/offload/state_store.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

class OptimizerOffload {
 public:
  // `optimizer` updates slices of `store` (built with OptimizerKernels::kCpuSimd); both outlive this.
  OptimizerOffload(FlatOptimizer& optimizer, std::unique_ptr<StateStore> store, ZeroStage& stage,
                   torch::ScalarType compute_dtype);

  // One optimizer step of the partition: `grads` is the fp32 gradient partition on the host, averaged, unscaled
  // and clipped. Returns with the parameters published and every write-back done.
  void step(const torch::Tensor& grads, double lr);

  // Publishes the master as the store holds it (after a checkpoint load or load_weights wrote it): each sub-group
  // rounded to the compute dtype and handed to the stage the same way.
  void publish();

  StateStore& store() { return *store_; }
  const StateStore& store() const { return *store_; }

 private:
  FlatOptimizer& optimizer_;
  std::unique_ptr<StateStore> store_;
  ZeroStage& stage_;
  torch::Tensor staging16_;  // (largest sub-group) the compute-dtype copy; undefined in fp32 training
};

}  // namespace dscpp
