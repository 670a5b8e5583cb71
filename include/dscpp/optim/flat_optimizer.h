// FlatOptimizer: an optimizer that updates one contiguous fp32 buffer (this rank's partition of the master
// weights) from a gradient buffer of the same size. Every ZeRO stage hands it a flat partition, so the optimizer
// never sees module structure, and its state is flat tensors that shard and checkpoint trivially.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/optim/options.h"

namespace dscpp {

// One range of the partition for FlatOptimizer::update, with the optimizer state of that range held by the caller.
struct OptimizerSlice {
  torch::Tensor param;               // 1-D fp32, updated in place
  torch::Tensor grad;                // same length, fp32: averaged over ranks, unscaled, clipped; not modified
  std::vector<torch::Tensor> state;  // one per state_kinds(), same length, fp32, updated in place
  // Optional (undefined: none). Receives the updated parameters in its own dtype: ZeRO-Offload's 16-bit copy,
  // written in the same pass by the CPU Adam.
  torch::Tensor param16;
  // This range's own weight decay (a parameter group's, e.g. none for biases and norms) instead of the optimizer's.
  std::optional<double> weight_decay;
};

// A range of the partition whose parameters have a weight decay of their own (DeepSpeed's parameter groups).
struct DecayRange {
  int64_t begin = 0;
  int64_t numel = 0;
  double weight_decay = 0.0;
};

class FlatOptimizer {
 public:
  virtual ~FlatOptimizer() = default;

  // One update of the whole partition with the optimizer's own state: begin_step() then update() over it.
  // `param` and `grad` are 1-D fp32 tensors of the size given at construction, on the same device.
  void step(torch::Tensor& param, const torch::Tensor& grad, double lr);

  // One update in pieces, for state that is not resident all at once (offload steps the partition sub-group by
  // sub-group, swapping each one's state in): begin_step() once, then update() for disjoint slices that together
  // cover the partition. The result equals step()'s. An optimizer built for 0 elements holds no state of its own
  // and updates only slices the caller provides.
  virtual void begin_step() = 0;
  virtual void update(const OptimizerSlice& slice, double lr) = 0;

  // update() for a slice that starts `offset` elements into the partition, split where set_decay_ranges gives
  // its elements another weight decay. Without such ranges it is update().
  void update_at(const OptimizerSlice& slice, int64_t offset, double lr);

  // Ranges of the partition updated with their own weight decay; the rest takes the optimizer's. Sorted by `begin`,
  // disjoint, inside [0, numel()) (std::invalid_argument otherwise). Adjacent ranges of one decay are merged, so
  // the number of updates a step makes is the number of changes of decay along the partition.
  void set_decay_ranges(std::vector<DecayRange> ranges);
  const std::vector<DecayRange>& decay_ranges() const { return decay_ranges_; }

  // The partition size given at construction.
  virtual int64_t numel() const = 0;

  // Sets state slices the caller holds to what a fresh optimizer starts from (zeros; Adagrad's
  // initial_accumulator_value).
  virtual void init_state(const std::vector<torch::Tensor>& state) const {
    for (const auto& t : state) t.zero_();
  }

  // Sets beta1 (Adam, Lion) or momentum (SGD) for schedules that cycle momentum (OneCycle). No-op where
  // the optimizer has none.
  virtual void set_momentum(double momentum) { (void)momentum; }

  // Named state buffers, each a 1-D tensor the size of the partition ("exp_avg", "exp_avg_sq", ...).
  // Returned tensors alias the optimizer's storage: loading a checkpoint copies into them.
  virtual std::vector<std::pair<std::string, torch::Tensor>> state_tensors() = 0;
  // The names of state_tensors(), in order: what an OptimizerSlice's state holds.
  std::vector<std::string> state_kinds();

  // Number of updates taken (Adam's bias-correction step).
  virtual int64_t step_count() const = 0;
  virtual void set_step_count(int64_t steps) = 0;

  virtual std::string name() const = 0;

 private:
  std::vector<DecayRange> decay_ranges_;
};

// Which arithmetic updates host tensors.
enum class OptimizerKernels {
  kTorch,    // in-place torch ops, on any device: the reference every stage agrees with bit for bit
  kCpuSimd,  // Adam/AdamW on host tensors through the fused SIMD CPU Adam (offload); ≤ 1e-6 relative from kTorch
};

// Builds the optimizer for a partition of `numel` elements. State is allocated with `options` (fp32, device).
// Throws std::invalid_argument naming the option for values the optimizer cannot use
// (e.g. "optimizer.params.nesterov requires momentum > 0").
std::unique_ptr<FlatOptimizer> make_flat_optimizer(const OptimizerConfig& config, int64_t numel,
                                                   const torch::TensorOptions& options,
                                                   OptimizerKernels kernels = OptimizerKernels::kTorch);

}  // namespace dscpp
