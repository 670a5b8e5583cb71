// A collective as one autograd operation: its forward runs without autograd and its result gets one backward node
// that maps the gradient with another collective (its transpose). Tensor parallelism's four operations and expert
// parallelism's all-to-all are built on it.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "dscpp/comm/comm.h"

namespace dscpp {

using TensorMap = std::function<torch::Tensor(const torch::Tensor&)>;

// forward(x), whose gradient flows back to x through backward(grad), named `name` in the autograd graph. The node
// holds the maps (and through them the group): a c10d group cannot live in an autograd Function's saved IValues.
// Over a group of one rank both are taken to be the identity and x comes back as it is.
torch::Tensor collective_op(const torch::Tensor& x, const std::shared_ptr<Comm>& group, const std::string& name,
                            const TensorMap& forward, TensorMap backward);

}  // namespace dscpp
