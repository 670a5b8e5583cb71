// GPT-2 MLP. GPT-2 was trained with the tanh approximation of GELU ("gelu_new" in HF), so loaded weights need it.
#include "model/mlp.h"

#include "dscpp/parallel/tensor_parallel_layers.h"
#include "model/dropout.h"

namespace gpt {

MlpImpl::MlpImpl(const GptConfig& config, std::shared_ptr<dscpp::Comm> group)
    : n_embd_(config.n_embd),
      dropout_(config.dropout),
      group_(group ? std::move(group) : dscpp::make_single_process_comm()) {
  reset();
}

void MlpImpl::reset() {
  c_fc = register_module("c_fc", torch::nn::Linear(n_embd_, 4 * n_embd_));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * n_embd_, n_embd_));
}

void MlpImpl::keep_own_slices() {
  const int p = group_->world_size(), r = group_->rank();
  if (p == 1) return;
  torch::NoGradGuard no_grad;
  c_fc->weight.set_data(c_fc->weight.chunk(p, 0)[r].clone());
  c_fc->bias.set_data(c_fc->bias.chunk(p, 0)[r].clone());
  c_proj->weight.set_data(c_proj->weight.chunk(p, 1)[r].clone());
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  const auto fc = dscpp::compression::compressed_linear(c_fc_compression, x, c_fc);
  auto h = torch::gelu(dscpp::column_parallel_linear(fc.input, fc.weight, fc.bias, group_), "tanh");
  const auto proj = dscpp::compression::compressed_linear(c_proj_compression, h, c_proj);
  auto y = dscpp::row_parallel_linear(proj.input, proj.weight, proj.bias, group_);
  return dropout_ > 0 && is_training() ? dropout(y, dropout_, sequence_group_) : y;
}

}  // namespace gpt
