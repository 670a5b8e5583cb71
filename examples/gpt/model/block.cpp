// Transformer block: submodules registered in HF's order so parameter names read h.<i>.ln_1 … h.<i>.mlp.c_proj.
#include "model/block.h"

namespace gpt {

BlockImpl::BlockImpl(const GptConfig& config, std::shared_ptr<dscpp::Comm> group, const MoeSettings* moe_settings) {
  const auto norm = torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_eps);
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(norm));
  attn = register_module("attn", CausalSelfAttention(config, group));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(norm));
  if (!moe_settings) {
    mlp = register_module("mlp", Mlp(config, group));
    return;
  }
  dscpp::moe::MoEOptions options;
  options.hidden_size = config.n_embd;
  options.num_experts = config.moe_experts;
  options.ep_size = moe_settings->ep_size;
  options.gate = moe_settings->gate;
  options.gate.k = config.moe_top_k;
  options.use_residual = config.moe_use_residual;
  moe = register_module("mlp", dscpp::moe::MoE(options, torch::nn::AnyModule(Mlp(config, group)),
                                               moe_settings->ep_group));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn->forward(ln_1->forward(x));
  if (!moe) return h + mlp->forward(ln_2->forward(h));
  auto routed = moe->forward(ln_2->forward(h));
  l_aux = routed.l_aux;
  return h + routed.output;
}

}  // namespace gpt
