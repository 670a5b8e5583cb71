// One pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
// The unit a ZeRO-3 wrapper gathers and releases (GptImpl::h holds them in order).
#pragma once

#include <torch/torch.h>

#include "model/attention.h"
#include "model/gpt_config.h"
#include "model/mlp.h"

namespace gpt {

class BlockImpl : public torch::nn::Module {
 public:
  // `group`: the tensor-parallel group the attention and MLP are sliced over (null: whole).
  explicit BlockImpl(const GptConfig& config, std::shared_ptr<dscpp::Comm> group = nullptr);

  // x: (B, T, C) → (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

}  // namespace gpt
