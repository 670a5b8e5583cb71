// Dropout whose mask is the one a single process would draw for the whole tensor, of which this rank holds part
// `part` of `parts` along dim 1 — its positions of longer sequences (DeepSpeed-Ulysses), or its heads of the whole
// attention (tensor parallelism, and Ulysses inside the attention). Every layout drops what one process drops, and
// the ranks' generators stay in step.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "dscpp/comm/comm.h"

namespace gpt {

// x times a Bernoulli(1 - p) draw of the whole tensor's shape (dim 1 × parts) scaled by 1 / (1 - p), its part `part`
// kept. Spelled out rather than torch::dropout: a GPU's fused dropout draws another way, and every layout must draw
// alike.
torch::Tensor dropout(const torch::Tensor& x, double p, int parts = 1, int part = 0);
// The same with x this rank's positions of sequences split over `sequence_group` (null or one rank: whole).
torch::Tensor dropout(const torch::Tensor& x, double p, const std::shared_ptr<dscpp::Comm>& sequence_group);

}  // namespace gpt
