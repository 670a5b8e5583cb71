// FlatParams: the model's parameters and gradients moved into two flat buffers of the compute dtype.
// Each parameter becomes a view into the param buffer and gets a gradient view into the grad buffer, so autograd
// accumulates straight into contiguous memory that the stages reduce and the optimizer reads without copies.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "dscpp/zero/flat_layout.h"

namespace dscpp {

class FlatParams {
 public:
  // `params[i]` is named `names[i]`; their current values are copied in. `params` keep their identity (same
  // torch::Tensor objects the model holds), only their storage moves.
  FlatParams(std::vector<torch::Tensor> params, const std::vector<std::string>& names, int world_size,
             torch::ScalarType dtype, int64_t alignment = 1);

  const FlatLayout& layout() const { return layout_; }
  torch::ScalarType dtype() const { return params_flat_.scalar_type(); }
  torch::Tensor& params() { return params_flat_; }  // (padded_numel) compute dtype
  torch::Tensor& grads() { return grads_flat_; }    // (padded_numel) compute dtype
  const torch::Tensor& params() const { return params_flat_; }
  const torch::Tensor& grads() const { return grads_flat_; }

  // Zeroes the gradient buffer and re-attaches every parameter's .grad view (a user's
  // module->zero_grad() sets them to undefined, which would otherwise detach them from the buffer).
  void zero_grads();

  // True when every parameter's .grad still aliases the buffer (checked before reducing).
  bool grads_attached() const;

 private:
  void attach_grads();

  FlatLayout layout_;
  std::vector<torch::Tensor> params_;
  torch::Tensor params_flat_;
  torch::Tensor grads_flat_;
};

}  // namespace dscpp
