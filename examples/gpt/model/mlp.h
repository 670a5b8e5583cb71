// The GPT-2 feed-forward block: Linear(C, 4C) → GELU (tanh approximation) → Linear(4C, C).
#pragma once

#include <torch/torch.h>

#include "model/gpt_config.h"

namespace gpt {

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const GptConfig& config);

  // x: (B, T, C) → (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr};    // (4C, C)
  torch::nn::Linear c_proj{nullptr};  // (C, 4C)

 private:
  double dropout_;
};
TORCH_MODULE(Mlp);

}  // namespace gpt
