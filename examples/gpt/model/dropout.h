// Dropout of (B, T, …) activations that may be this rank's positions of longer sequences (DeepSpeed-Ulysses): the
// mask one process would draw for the whole sequences is drawn, and this rank's positions of it kept — so a sequence
// split over P ranks drops what one process drops, and the ranks' generators stay in step.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "dscpp/comm/comm.h"

namespace gpt {

// torch::dropout(x, p, /*train=*/true) over the whole sequences; x holds positions
// [rank·T, (rank+1)·T) of them along dim 1 when `sequence_group` has more than one rank.
torch::Tensor dropout(const torch::Tensor& x, double p, const std::shared_ptr<dscpp::Comm>& sequence_group);

}  // namespace gpt
