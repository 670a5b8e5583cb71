// Causal multi-head self-attention with GPT-2's fused q/k/v projection (HF GPT2Attention layout).
#pragma once

#include <torch/torch.h>

#include "model/gpt_config.h"

namespace gpt {

// dropout(softmax(q·kᵀ/√d + causal mask), dropout_p)·v for (B, nh, T, hs) tensors. The one place a LibTorch 2.x
// build swaps in at::scaled_dot_product_attention (1.13's C++ API has no fused kernel).
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               double dropout_p = 0.0);

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& config);

  // x: (B, T, C) → (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_attn{nullptr};  // (3C, C) weight: q, k, v stacked along the output dim
  torch::nn::Linear c_proj{nullptr};  // (C, C)

 private:
  int64_t n_head_;
  double dropout_;
};
TORCH_MODULE(CausalSelfAttention);

}  // namespace gpt
