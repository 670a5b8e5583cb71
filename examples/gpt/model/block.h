// One pre-LayerNorm transformer block: x + attn(ln_1(x)), then x + mlp(ln_2(x)).
// The unit a ZeRO-3 wrapper gathers and releases (GptImpl::h holds them in order).
#pragma once

#include <torch/torch.h>

#include "dscpp/moe/moe_layer.h"
#include "model/attention.h"
#include "model/gpt_config.h"
#include "model/mlp.h"

namespace gpt {

// How the MoE blocks (GptConfig::is_moe_block) route and where their experts live.
struct MoeSettings {
  dscpp::moe::GateOptions gate;           // k comes from GptConfig::moe_top_k
  int ep_size = 1;
  std::shared_ptr<dscpp::Comm> ep_group;  // moe::ExpertGroups::expert_parallel; null for ep_size 1
  double loss_coeff = 0.01;               // the aux loss's weight in GptImpl::loss (DeepSpeed-MoE's default)
};

class BlockImpl : public torch::nn::Module {
 public:
  // `group`: the tensor-parallel group the attention and MLP are sliced over (null: whole). `moe`: an MoE block's
  // settings (null: a dense block).
  explicit BlockImpl(const GptConfig& config, std::shared_ptr<dscpp::Comm> group = nullptr,
                     const MoeSettings* moe = nullptr);

  // x: (B, T, C) → (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  Mlp mlp{nullptr};             // a dense block's
  dscpp::moe::MoE moe{nullptr};  // an MoE block's, registered as "mlp"
  // An MoE block's load-balancing loss from its last forward (undefined for a dense block).
  torch::Tensor l_aux;
};
TORCH_MODULE(Block);

}  // namespace gpt
