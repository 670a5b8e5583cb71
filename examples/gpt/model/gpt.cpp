// Gpt: embeddings → blocks → ln_f → tied head, plus GPT-2's weight initialization.
#include "model/gpt.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace gpt {
namespace {

constexpr double kInitStd = 0.02;  // GPT-2's initializer_range

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_of(const torch::Tensor& t) {
  std::string s = "(";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + ")";
}

}  // namespace

GptImpl::GptImpl(GptConfig config) : config_(std::move(config)) {
  config_.validate();
  // Registration order is HF's order, which is the order named_parameters() lists.
  wte = register_module("wte", torch::nn::Embedding(config_.vocab_size, config_.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(config_.block_size, config_.n_embd));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    blocks_.push_back(Block(config_));
    h->push_back(blocks_.back());
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(
                                     torch::nn::LayerNormOptions({config_.n_embd}).eps(config_.layer_norm_eps)));
  init_weights();
}

void GptImpl::init_weights() {
  torch::NoGradGuard no_grad;
  // Residual-stream outputs are scaled down so the sum over 2·n_layer residual additions keeps unit scale.
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  for (const auto& item : named_modules(/*name_prefix=*/"", /*include_self=*/false)) {
    if (auto* linear = item.value()->as<torch::nn::Linear>()) {
      linear->weight.normal_(0.0, ends_with(item.key(), "c_proj") ? residual_std : kInitStd);
      linear->bias.zero_();
    } else if (auto* embedding = item.value()->as<torch::nn::Embedding>()) {
      embedding->weight.normal_(0.0, kInitStd);
    } else if (auto* norm = item.value()->as<torch::nn::LayerNorm>()) {
      norm->weight.fill_(1.0);
      norm->bias.zero_();
    }
  }
}

torch::Tensor GptImpl::embed(const torch::Tensor& idx) {
  if (idx.dim() != 2 || idx.scalar_type() != torch::kLong) {
    throw std::invalid_argument("Gpt::forward: idx must be a (B, T) int64 tensor, got shape " + shape_of(idx) +
                                " of " + std::string(c10::toString(idx.scalar_type())));
  }
  const int64_t T = idx.size(1);
  if (T > config_.block_size) {
    throw std::invalid_argument("Gpt::forward: sequence length " + std::to_string(T) + " exceeds block_size " +
                                std::to_string(config_.block_size) + "; lower --seq_len");
  }
  const auto positions = torch::arange(T, idx.options());  // (T), broadcast over the batch
  return wte->forward(idx) + wpe->forward(positions);
}

torch::Tensor GptImpl::head(const torch::Tensor& x) {
  return torch::nn::functional::linear(ln_f->forward(x), wte->weight);
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  auto x = embed(idx);
  for (auto& block : blocks_) {
    auto call = [&block, &x] { return block->forward(x); };
    x = block_runner_ ? block_runner_(*block, call) : call();
  }
  return head(x);
}

torch::Tensor GptImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  if (targets.sizes() != idx.sizes()) {
    throw std::invalid_argument("Gpt::loss: targets shape " + shape_of(targets) + " must equal idx shape " +
                                shape_of(idx));
  }
  const auto logits = forward(idx);
  // fp32 log-softmax: bf16/fp16 logits lose too much precision over a 50k vocabulary.
  return torch::nn::functional::cross_entropy(logits.reshape({-1, config_.vocab_size}).to(torch::kFloat),
                                              targets.reshape({-1}));
}

}  // namespace gpt
