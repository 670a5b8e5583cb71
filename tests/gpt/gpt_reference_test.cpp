// Gpt::forward against a plain reference written from GPT-2's equations, reading the weights by their HF names:
// explicit LayerNorm, per-position causal attention loops, and the tanh GELU formula.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>

#include "model/attention.h"
#include "model/gpt.h"

namespace gpt {
namespace {

using Weights = std::map<std::string, torch::Tensor>;

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  const auto mean = x.mean(-1, true);
  const auto var = (x - mean).pow(2).mean(-1, true);  // biased, as LayerNorm
  return (x - mean) / torch::sqrt(var + 1e-5) * w + b;
}

torch::Tensor linear(const torch::Tensor& x, const Weights& w, const std::string& name) {
  return torch::matmul(x, w.at(name + ".weight").t()) + w.at(name + ".bias");
}

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  return 0.5 * x * (1 + torch::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))));
}

// x: (T, C) for one sequence; each position attends to positions 0..t only.
torch::Tensor attention(const torch::Tensor& x, const Weights& w, const std::string& p, int64_t n_head) {
  const int64_t T = x.size(0), C = x.size(1), hs = C / n_head;
  const auto qkv = linear(x, w, p + "attn.c_attn");  // (T, 3C): q | k | v
  auto y = torch::zeros({T, C}, x.options());
  for (int64_t h = 0; h < n_head; ++h) {
    const auto q = qkv.slice(1, h * hs, (h + 1) * hs);
    const auto k = qkv.slice(1, C + h * hs, C + (h + 1) * hs);
    const auto v = qkv.slice(1, 2 * C + h * hs, 2 * C + (h + 1) * hs);
    for (int64_t t = 0; t < T; ++t) {
      const auto scores = torch::mv(k.slice(0, 0, t + 1), q[t]) / std::sqrt(static_cast<double>(hs));  // (t+1)
      const auto weights = torch::softmax(scores, 0);
      y.index_put_({t, torch::indexing::Slice(h * hs, (h + 1) * hs)}, torch::mv(v.slice(0, 0, t + 1).t(), weights));
    }
  }
  return linear(y, w, p + "attn.c_proj");
}

torch::Tensor reference_logits(const torch::Tensor& idx, const Weights& w, const GptConfig& c) {
  const int64_t T = idx.size(0);
  auto x = w.at("wte.weight").index_select(0, idx) + w.at("wpe.weight").slice(0, 0, T);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const auto p = "h." + std::to_string(i) + ".";
    x = x + attention(layer_norm(x, w.at(p + "ln_1.weight"), w.at(p + "ln_1.bias")), w, p, c.n_head);
    const auto hidden = gelu_tanh(linear(layer_norm(x, w.at(p + "ln_2.weight"), w.at(p + "ln_2.bias")), w,
                                         p + "mlp.c_fc"));
    x = x + linear(hidden, w, p + "mlp.c_proj");
  }
  x = layer_norm(x, w.at("ln_f.weight"), w.at("ln_f.bias"));
  return torch::matmul(x, w.at("wte.weight").t());  // tied head
}

TEST(GptReference, ForwardMatchesGpt2Equations) {
  torch::manual_seed(11);
  GptConfig c;
  c.vocab_size = 50;
  c.block_size = 12;
  c.n_layer = 2;
  c.n_head = 3;
  c.n_embd = 24;
  Gpt model(c);
  Weights w;
  {
    torch::NoGradGuard no_grad;
    // Non-trivial LayerNorm/bias values, so a wrong LayerNorm or a dropped bias shows up.
    for (auto& p : model->named_parameters()) {
      p.value().add_(torch::randn_like(p.value()) * 0.1);
      w[p.key()] = p.value().detach().to(torch::kDouble);
    }
  }
  const auto idx = torch::randint(c.vocab_size, {2, 9}, torch::kLong);
  const auto logits = model->forward(idx).detach().to(torch::kDouble);
  ASSERT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, 9, c.vocab_size}));
  for (int64_t b = 0; b < 2; ++b) {
    const auto want = reference_logits(idx[b], w, c);
    EXPECT_TRUE(torch::allclose(logits[b], want, 1e-4, 1e-4))
        << "max abs diff " << (logits[b] - want).abs().max().item<double>();
  }
}

TEST(GptReference, GeluIsTheTanhApproximation) {
  const auto x = torch::linspace(-6, 6, 97, torch::kDouble);
  EXPECT_TRUE(torch::allclose(torch::gelu(x, "tanh"), gelu_tanh(x), 0.0, 1e-12));
  // ... and differs from the exact erf GELU, so the test can tell them apart.
  EXPECT_GT((torch::gelu(x) - gelu_tanh(x)).abs().max().item<double>(), 1e-5);
}

TEST(GptReference, CausalAttentionMatchesLoop) {
  torch::manual_seed(12);
  const auto q = torch::randn({2, 3, 7, 4}, torch::kDouble);
  const auto k = torch::randn({2, 3, 7, 4}, torch::kDouble);
  const auto v = torch::randn({2, 3, 7, 4}, torch::kDouble);
  const auto y = causal_attention(q, k, v);
  for (int64_t t = 0; t < 7; ++t) {
    const auto keys = k.slice(2, 0, t + 1);                                                 // (2, 3, t+1, 4)
    const auto s = torch::matmul(keys, q.select(2, t).unsqueeze(-1)).squeeze(-1) / 2.0;     // (2, 3, t+1)
    const auto want = torch::matmul(torch::softmax(s, -1).unsqueeze(2), v.slice(2, 0, t + 1)).squeeze(2);
    EXPECT_TRUE(torch::allclose(y.select(2, t), want, 1e-10, 1e-10)) << "t=" << t;
  }
}

}  // namespace
}  // namespace gpt
