// FlatParams: the model's parameters moved into one flat buffer of the compute dtype (each parameter becomes a
// view into it), and optionally a flat gradient buffer that autograd accumulates into directly. Stages that keep
// whole gradients (0, 1) attach the gradient buffer; stage 2 does not, and takes gradients from hooks instead.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "dscpp/zero/flat_layout.h"

namespace dscpp {

class FlatParams {
 public:
  // `params[i]` is named `names[i]`; their current values are copied in. `params` keep their identity (the same
  // tensors the model holds); only their storage moves. The buffers live on `device`, where every parameter must be.
  // `params` may be empty (an engine built forward only trains none): the buffers then hold only group padding.
  // `group_numel` sizes the communication groups.
  // Mixture of Experts: `expert[i]` marks an expert's parameter, sharded over the expert-data-parallel group of
  // expert parallelism `expert_parallel` (FlatLayout); empty: none.
  FlatParams(std::vector<torch::Tensor> params, const std::vector<std::string>& names, int world_size,
             torch::ScalarType dtype, torch::Device device, int64_t group_numel, const std::vector<bool>& expert = {},
             int expert_parallel = 1);

  const FlatLayout& layout() const { return layout_; }
  torch::ScalarType dtype() const { return params_flat_.scalar_type(); }
  const std::vector<torch::Tensor>& param_tensors() const { return params_; }

  torch::Tensor& params() { return params_flat_; }  // (padded_numel) compute dtype
  const torch::Tensor& params() const { return params_flat_; }

  // The whole-model gradient buffer: allocated by attach_grad_buffer(), undefined before.
  torch::Tensor& grads() { return grads_flat_; }    // (padded_numel) compute dtype
  const torch::Tensor& grads() const { return grads_flat_; }

  // Allocates the gradient buffer and points every parameter's .grad at its slice.
  void attach_grad_buffer();

  // Zeroes the gradient buffer and re-attaches the .grad views (a user's module->zero_grad() sets them to
  // undefined, which would otherwise detach them from the buffer).
  void zero_grads();

  // True when every parameter's .grad still aliases the buffer.
  bool grads_attached() const;

  // Before a backward: re-attach (zeroed) if the user set the grads to None (LibTorch's module->zero_grad()).
  void keep_grads_attached();
  // After a backward: throws if autograd replaced a .grad instead of accumulating into it (create_graph=true does),
  // which would silently lose that micro-step's gradient.
  void check_grads_attached() const;

  // fn(name, parameter) for every parameter, in layout order (stages 0-2's visit_params).
  void visit(const std::function<void(const std::string&, const torch::Tensor&)>& fn) const;

  // A copy of rank `rank`'s shard of every group, in group order (partition_numel elements).
  torch::Tensor partition(int rank) const;

  // The slice of `flat` (any tensor shaped like the buffer) that holds slot `i`, shaped like the parameter.
  torch::Tensor slot_view(const torch::Tensor& flat, size_t i) const;

 private:
  FlatLayout layout_;
  std::vector<torch::Tensor> params_;
  torch::Tensor params_flat_;
  torch::Tensor grads_flat_;
};

}  // namespace dscpp
