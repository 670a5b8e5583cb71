// FlatOptimizer: an optimizer that updates one contiguous fp32 buffer (this rank's partition of the master
// weights) from a gradient buffer of the same size. Every ZeRO stage hands it a flat partition, so the optimizer
// never sees module structure, and its state is flat tensors that shard and checkpoint trivially.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
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

// A parameter group's settings where they differ from the optimizer's (DeepSpeed's and torch's param_groups:
// typically no weight decay for biases and norms, or a smaller lr for some layers).
struct GroupSettings {
  std::optional<double> weight_decay;  // none: the optimizer's
  std::optional<double> lr;            // none: the lr the step is given (the engine's schedule)
};

// A range of the partition whose parameters belong to group `group` of FlatOptimizer::set_groups.
struct GroupRange {
  int64_t begin = 0;
  int64_t numel = 0;
  int group = 0;
};

// Where one model tensor's elements lie in the partition (FlatOptimizer::set_partition_tensors).
struct TensorRange {
  int64_t begin = 0;
  int64_t numel = 0;
  int tensor = 0;  // which of the model's tensors, the same index on every rank
};

// The model's tensors as they lie in this rank's partition, for optimizers whose update depends on each whole tensor
// (LAMB's trust ratio, 1-bit LAMB's scaling coefficients); the others ignore it.
struct PartitionTensors {
  // Sorted by begin, disjoint, inside the partition; elements in none of them (ZeRO's padding) belong to no tensor.
  std::vector<TensorRange> ranges;
  int tensor_count = 0;  // ranges name tensors in [0, tensor_count) on every rank
  // Sums a (rows, tensor_count) fp32 tensor in place over the ranks holding the other pieces of these tensors (a
  // ZeRO partition holds pieces); empty where this rank holds each of its tensors whole. Every rank of that group
  // calls it in the same steps, as any collective.
  std::function<void(torch::Tensor&)> sum_over_ranks;
};

class FlatOptimizer {
 public:
  virtual ~FlatOptimizer() = default;

  // One update of the whole partition with the optimizer's own state: begin_step() then update() over it.
  // `param` and `grad` are 1-D fp32 tensors of the size given at construction, on the same device. An optimizer
  // that communicates over the whole partition in its step (the 1-bit optimizers' compressed momentum) overrides it.
  virtual void step(torch::Tensor& param, const torch::Tensor& grad, double lr);

  // The gradient the next step wants, asked by the engine at each boundary before the gradients are reduced:
  // false, the average over the data-parallel ranks (every optimizer, and the 1-bit ones while warming up); true,
  // this rank's own, unreduced: the 1-bit optimizers once compression starts, which average their momentum instead.
  virtual bool wants_local_gradients() const { return false; }

  // One update in pieces, for state that is not resident all at once (offload steps the partition sub-group by
  // sub-group, swapping each one's state in): begin_step() once, then update() for disjoint slices that together
  // cover the partition. The result equals step()'s. An optimizer built for 0 elements holds no state of its own
  // and updates only slices the caller provides.
  virtual void begin_step() = 0;
  virtual void update(const OptimizerSlice& slice, double lr) = 0;

  // update() for a slice that starts `offset` elements into the partition, split where set_groups puts its
  // elements in a group of their own, each piece with its group's weight decay and lr. Without groups it is update().
  void update_at(const OptimizerSlice& slice, int64_t offset, double lr);

  // Parameter groups: `ranges` of the partition take the settings of `groups[range.group]`, the rest the
  // optimizer's. Ranges sorted by `begin`, disjoint, inside [0, numel()), naming a group that exists
  // (std::invalid_argument otherwise). Adjacent ranges of one group are merged, so a step makes one update per
  // change of group along the partition.
  void set_groups(std::vector<GroupSettings> groups, std::vector<GroupRange> ranges);
  // A group's lr from now on (none: the lr the step is given): a client schedule moving each group's lr.
  void set_group_lr(int group, std::optional<double> lr);
  const std::vector<GroupSettings>& groups() const { return groups_; }
  const std::vector<GroupRange>& group_ranges() const { return group_ranges_; }
  // The settings of the group holding partition element `offset` (all unset outside every group's ranges).
  GroupSettings group_at(int64_t offset) const;

  // The model's tensors in this partition (std::invalid_argument unless the ranges are sorted, disjoint, inside
  // the partition and name tensors in [0, tensor_count)). Never set: the whole partition is one tensor.
  void set_partition_tensors(PartitionTensors tensors);
  const PartitionTensors& partition_tensors() const { return tensors_; }

  // The partition size given at construction.
  virtual int64_t numel() const = 0;

  // Sets state slices the caller holds to what a fresh optimizer starts from (zeros; Adagrad's
  // initial_accumulator_value).
  virtual void init_state(const std::vector<torch::Tensor>& state) const {
    for (const auto& t : state) t.zero_();
  }

  // Sets the betas (Adam, Lion) for schedules that cycle momentum (OneCycle). A no-op where the optimizer has none,
  // SGD included: DeepSpeed's OneCycle writes a param group's "betas", which torch's SGD does not read.
  virtual void set_betas(double beta1, double beta2) { (void)beta1, (void)beta2; }

  // Named state buffers, each a 1-D tensor the size of the partition ("exp_avg", "exp_avg_sq", ...).
  // Returned tensors alias the optimizer's storage: loading a checkpoint copies into them.
  virtual std::vector<std::pair<std::string, torch::Tensor>> state_tensors() = 0;
  // The names of state_tensors(), in order: what an OptimizerSlice's state holds.
  std::vector<std::string> state_kinds();

  // State that belongs to this rank at this world size rather than to the parameters (the 1-bit optimizers' error
  // feedback): checkpoints keep it in the rank's own file, and only a run of the same world size takes it back.
  // Aliases the optimizer's storage, as state_tensors().
  virtual std::vector<std::pair<std::string, torch::Tensor>> rank_state() { return {}; }
  // Small state every rank holds identically, not per element (1-bit LAMB's per-tensor coefficients): checkpoints
  // keep it in every rank's file, and a run of any world size takes it back from the first rank's. Aliases the
  // optimizer's storage, as state_tensors().
  virtual std::vector<std::pair<std::string, torch::Tensor>> replicated_state() { return {}; }

  // Number of updates taken (Adam's bias-correction step).
  virtual int64_t step_count() const = 0;
  virtual void set_step_count(int64_t steps) = 0;

  virtual std::string name() const = 0;

 private:
  std::vector<GroupSettings> groups_;
  std::vector<GroupRange> group_ranges_;
  PartitionTensors tensors_;
};

// Which arithmetic updates the partition.
enum class OptimizerKernels {
  kTorch,    // in-place torch ops, on any device: the reference the fused kernels are tested against
  // Adam/AdamW on host tensors through the fused SIMD CPU Adam (cpu_adam.h): the engine's choice for master weights
  // on the host, offloaded or not; ≤ 1e-6 relative from kTorch, and the same bits wherever a partition boundary falls
  kCpuSimd,
  // Adam/AdamW through torch's fused kernel (torch.optim's fused=True: one pass over p, g, m and v instead of
  // eight); ≤ 1e-6 relative from kTorch. The engine's choice when the master weights live on a GPU. The other
  // optimizers, and Adam without bias correction (which the fused kernel always applies), keep kTorch's arithmetic.
  kFused,
};

// Builds the optimizer for a partition of `numel` elements. State is allocated with `options` (fp32, device).
// Throws std::invalid_argument naming the option for values the optimizer cannot use
// (e.g. "optimizer.params.nesterov requires momentum > 0").
std::unique_ptr<FlatOptimizer> make_flat_optimizer(const OptimizerConfig& config, int64_t numel,
                                                   const torch::TensorOptions& options,
                                                   OptimizerKernels kernels = OptimizerKernels::kTorch);

}  // namespace dscpp
