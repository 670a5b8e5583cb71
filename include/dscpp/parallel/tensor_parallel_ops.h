// The four collectives of Megatron-style tensor parallelism, as autograd operations over the model-parallel group
// (ParallelGroups::model). Each is the other's transpose, so a layer's forward and backward communicate once each:
//   copy_to_model_parallel      forward: identity            backward: all-reduce  (Megatron's f)
//   reduce_from_model_parallel  forward: all-reduce          backward: identity    (Megatron's g)
//   gather_from_model_parallel  forward: all-gather last dim backward: this rank's slice
//   scatter_to_model_parallel   forward: this rank's slice   backward: all-gather last dim
// Over a group of one rank each is the identity.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "dscpp/comm/comm.h"

namespace dscpp {

torch::Tensor copy_to_model_parallel(const torch::Tensor& x, const std::shared_ptr<Comm>& group);
torch::Tensor reduce_from_model_parallel(const torch::Tensor& x, const std::shared_ptr<Comm>& group);
// x (…, n) on every rank → (…, n · group size), rank r's x at columns [r·n, (r+1)·n).
torch::Tensor gather_from_model_parallel(const torch::Tensor& x, const std::shared_ptr<Comm>& group);
// x (…, n · group size) → (…, n), this rank's columns; std::invalid_argument when the size does not divide.
torch::Tensor scatter_to_model_parallel(const torch::Tensor& x, const std::shared_ptr<Comm>& group);

}  // namespace dscpp
