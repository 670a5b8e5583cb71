// defines: gpt::linear — a linear layer's forward as PyTorch's F.linear computes it.
// at::linear folds a contiguous (B, T, C) input into one addmm, so x·Wᵀ + b is rounded once in bf16, as PyTorch's
// F.linear and HF GPT-2's Conv1D round it. LibTorch 1.13's C++ torch::nn::Linear::forward instead runs matmul and
// then += bias on inputs of more than two dimensions: two roundings, and bf16 losses that differ from PyTorch's from
// the first step. The GPT keeps torch::nn::Linear for its parameters and names, and calls this for the math.
#pragma once

#include <torch/torch.h>

namespace gpt {

inline torch::Tensor linear(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return torch::linear(x, layer->weight, layer->bias);
}

}  // namespace gpt
