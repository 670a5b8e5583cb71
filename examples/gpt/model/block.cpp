// Transformer block: submodules registered in HF's order so parameter names read h.<i>.ln_1 … h.<i>.mlp.c_proj.
#include "model/block.h"

namespace gpt {

BlockImpl::BlockImpl(const GptConfig& config, std::shared_ptr<dscpp::Comm> group) {
  const auto norm = torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_eps);
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(norm));
  attn = register_module("attn", CausalSelfAttention(config, group));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(norm));
  mlp = register_module("mlp", Mlp(config, group));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn->forward(ln_1->forward(x));
  return h + mlp->forward(ln_2->forward(h));
}

}  // namespace gpt
