// GPT-2 MLP. GPT-2 was trained with the tanh approximation of GELU ("gelu_new" in HF), so loaded weights need it.
#include "model/mlp.h"

#include "model/linear.h"

namespace gpt {

MlpImpl::MlpImpl(const GptConfig& config) : dropout_(config.dropout) {
  c_fc = register_module("c_fc", torch::nn::Linear(config.n_embd, 4 * config.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * config.n_embd, config.n_embd));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  auto y = linear(c_proj, torch::gelu(linear(c_fc, x), "tanh"));
  return dropout_ > 0 && is_training() ? torch::dropout(y, dropout_, /*train=*/true) : y;
}

}  // namespace gpt
