// Gpt model behaviour: HF parameter names, GPT-2 init, causality, initial loss, bf16, and that it can learn.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "model/attention.h"
#include "model/block.h"
#include "model/gpt.h"

namespace gpt {
namespace {

GptConfig micro_config() {
  GptConfig c;
  c.vocab_size = 61;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  return c;
}

TEST(GptModel, ParameterNamesAndShapesFollowHf) {
  const auto c = micro_config();
  Gpt model(c);
  const int64_t C = c.n_embd;
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"wte.weight", {c.vocab_size, C}}, {"wpe.weight", {c.block_size, C}}};
  for (int i = 0; i < c.n_layer; ++i) {
    const auto p = "h." + std::to_string(i) + ".";
    const std::vector<std::pair<std::string, std::vector<int64_t>>> block = {
        {p + "ln_1.weight", {C}},         {p + "ln_1.bias", {C}},
        {p + "attn.c_attn.weight", {3 * C, C}}, {p + "attn.c_attn.bias", {3 * C}},
        {p + "attn.c_proj.weight", {C, C}},     {p + "attn.c_proj.bias", {C}},
        {p + "ln_2.weight", {C}},         {p + "ln_2.bias", {C}},
        {p + "mlp.c_fc.weight", {4 * C, C}},    {p + "mlp.c_fc.bias", {4 * C}},
        {p + "mlp.c_proj.weight", {C, 4 * C}},  {p + "mlp.c_proj.bias", {C}}};
    expected.insert(expected.end(), block.begin(), block.end());
  }
  expected.push_back({"ln_f.weight", {C}});
  expected.push_back({"ln_f.bias", {C}});

  const auto params = model->named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(params[i].key(), expected[i].first);
    EXPECT_EQ(params[i].value().sizes().vec(), expected[i].second) << expected[i].first;
  }
  EXPECT_EQ(model->named_buffers().size(), 0u);  // no causal-mask buffer to broadcast or checkpoint
  ASSERT_EQ(model->blocks().size(), static_cast<size_t>(c.n_layer));
  EXPECT_EQ(model->blocks()[1].get(), model->h->ptr(1).get());
}

TEST(GptModel, Gpt2InitIsDeterministicWithTheRightScales) {
  auto c = GptConfig::preset("tiny", 256);
  torch::manual_seed(7);
  Gpt a(c);
  torch::manual_seed(7);
  Gpt b(c);
  const auto pa = a->named_parameters();
  const auto pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i].value(), pb[i].value())) << pa[i].key();

  const double residual_std = 0.02 / std::sqrt(2.0 * c.n_layer);
  for (const auto& p : pa) {
    const auto& name = p.key();
    const auto& t = p.value();
    const bool is_norm = name.find("ln_") != std::string::npos;
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      EXPECT_EQ(t.abs().max().item<float>(), 0.0f) << name;
    } else if (is_norm) {
      EXPECT_TRUE(torch::equal(t, torch::ones_like(t))) << name;
    } else {
      const double want = name.find("c_proj") != std::string::npos ? residual_std : 0.02;
      EXPECT_NEAR(t.mean().item<double>(), 0.0, want * 0.05) << name;
      EXPECT_NEAR(t.std().item<double>(), want, want * 0.05) << name;
    }
  }
}

TEST(GptModel, LaterTokensDoNotChangeEarlierLogits) {
  torch::manual_seed(1);
  const auto c = micro_config();
  Gpt model(c);
  const auto idx = torch::randint(c.vocab_size, {2, 12}, torch::kLong);
  for (int64_t t : {0, 5, 10}) {
    auto changed = idx.clone();
    changed.index_put_({torch::indexing::Slice(), t + 1}, (idx.index({torch::indexing::Slice(), t + 1}) + 1) % c.vocab_size);
    const auto before = model->forward(idx);
    const auto after = model->forward(changed);
    const auto past = torch::indexing::Slice(0, t + 1);
    EXPECT_TRUE(torch::allclose(before.index({torch::indexing::Slice(), past}),
                                after.index({torch::indexing::Slice(), past}), 0.0, 1e-6)) << "t=" << t;
    // ... while the changed position itself does see the change.
    EXPECT_FALSE(torch::allclose(before.index({torch::indexing::Slice(), t + 1}),
                                 after.index({torch::indexing::Slice(), t + 1}), 0.0, 1e-4)) << "t=" << t;
  }
}

TEST(GptModel, InitialLossIsNearLnVocab) {
  torch::manual_seed(2);
  const auto c = GptConfig::preset("tiny", 256);
  Gpt model(c);
  const auto idx = torch::randint(c.vocab_size, {8, 64}, torch::kLong);
  const auto targets = torch::randint(c.vocab_size, {8, 64}, torch::kLong);
  const double loss = model->loss(idx, targets).item<double>();
  EXPECT_NEAR(loss, std::log(256.0), 0.1);
}

TEST(GptModel, LossIsMeanCrossEntropyOfForward) {
  torch::manual_seed(3);
  const auto c = micro_config();
  Gpt model(c);
  const auto idx = torch::randint(c.vocab_size, {3, 10}, torch::kLong);
  const auto targets = torch::randint(c.vocab_size, {3, 10}, torch::kLong);
  const auto logp = torch::log_softmax(model->forward(idx), -1);       // (B, T, V)
  const auto picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1);  // (B, T)
  EXPECT_NEAR(model->loss(idx, targets).item<double>(), -picked.mean().item<double>(), 1e-5);
}

TEST(GptModel, PaddedVocabularyGetsNoProbability) {
  // llm.c's padded table: 61 rows, the data's 50 tokens; the softmax covers the 50 only.
  torch::manual_seed(3);
  auto c = micro_config();
  c.data_vocab_size = 50;
  Gpt model(c);
  const auto idx = torch::randint(50, {3, 10}, torch::kLong);
  const auto targets = torch::randint(50, {3, 10}, torch::kLong);
  const auto logits = model->forward(idx);
  EXPECT_EQ(logits.size(-1), 61);
  const auto logp = torch::log_softmax(logits.narrow(-1, 0, 50), -1);
  const auto picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  const double loss = model->loss(idx, targets).item<double>();
  EXPECT_NEAR(loss, -picked.mean().item<double>(), 1e-5);
  // Over the whole table the loss would be larger by the padding rows' share of probability.
  const auto whole = torch::log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1);
  EXPECT_GT(-whole.mean().item<double>() - loss, 1e-3);
  c.data_vocab_size = 62;
  EXPECT_THROW(c.validate(), std::invalid_argument);
}

TEST(GptModel, Bf16ForwardBackwardIsFinite) {
  torch::manual_seed(4);
  const auto c = GptConfig::preset("tiny", 256);
  Gpt model(c);
  model->to(torch::kBFloat16);
  const auto idx = torch::randint(c.vocab_size, {2, 32}, torch::kLong);
  const auto targets = torch::randint(c.vocab_size, {2, 32}, torch::kLong);
  EXPECT_EQ(model->forward(idx).scalar_type(), torch::kBFloat16);
  const auto loss = model->loss(idx, targets);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  EXPECT_NEAR(loss.item<double>(), std::log(256.0), 0.15);
  loss.backward();
  for (const auto& p : model->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_EQ(p.value().grad().scalar_type(), torch::kBFloat16) << p.key();
    EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
  EXPECT_GT(model->wte->weight.grad().abs().sum().item<double>(), 0.0);
}

// bf16 rounds as PyTorch does: each linear layer is one addmm over the (B·T, C) view, as PyTorch's F.linear and HF
// GPT-2's Conv1D compute it, so x·Wᵀ + b is rounded once. The block's forward equals a reference built that way bit
// for bit; the same reference with matmul then += bias (LibTorch 1.13's C++ Linear on 3-D input) differs, so the
// comparison can tell the two apart.
TEST(GptModel, Bf16BlockRoundsEachLinearOnceAsPyTorchDoes) {
  torch::manual_seed(6);
  const auto c = GptConfig::preset("tiny", 256);
  Block block(c);
  block->to(torch::kBFloat16);
  torch::NoGradGuard no_grad;
  for (auto& p : block->parameters()) p.add_(torch::randn_like(p) * 0.1);  // biases too: they are what is rounded
  const int64_t B = 2, T = 32, C = c.n_embd;
  const auto x = torch::randn({B, T, C}).to(torch::kBFloat16);

  using Linear = std::function<torch::Tensor(const torch::Tensor&, const torch::nn::Linear&)>;
  const Linear fused = [](const torch::Tensor& in, const torch::nn::Linear& l) {
    const auto rows = in.reshape({-1, in.size(-1)});
    return torch::addmm(l->bias, rows, l->weight.t()).view({in.size(0), in.size(1), -1});
  };
  const Linear unfused = [](const torch::Tensor& in, const torch::nn::Linear& l) {
    auto out = torch::matmul(in, l->weight.t());
    out += l->bias;
    return out;
  };
  const auto reference = [&](const Linear& linear) {
    const auto attn = [&](const torch::Tensor& in) {
      const auto qkv = linear(in, block->attn->c_attn).split(C, 2);
      const auto heads = [&](const torch::Tensor& t) { return t.view({B, T, c.n_head, C / c.n_head}).transpose(1, 2); };
      const auto y = causal_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]));
      return linear(y.transpose(1, 2).contiguous().view({B, T, C}), block->attn->c_proj);
    };
    const auto mlp = [&](const torch::Tensor& in) {
      return linear(torch::gelu(linear(in, block->mlp->c_fc), "tanh"), block->mlp->c_proj);
    };
    const auto h = x + attn(block->ln_1->forward(x));
    return h + mlp(block->ln_2->forward(h));
  };
  const auto want = reference(fused);
  EXPECT_TRUE(torch::equal(block->forward(x), want));
  EXPECT_FALSE(torch::equal(reference(unfused), want)) << "the two roundings should differ somewhere";
}

TEST(GptModel, AdamWOverfitsOneBatch) {
  torch::manual_seed(5);
  const auto c = GptConfig::preset("tiny", 256);
  Gpt model(c);
  const auto idx = torch::randint(c.vocab_size, {4, 32}, torch::kLong);
  const auto targets = torch::randint(c.vocab_size, {4, 32}, torch::kLong);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.0));
  const double first = model->loss(idx, targets).item<double>();
  double last = first;
  for (int step = 0; step < 40; ++step) {
    opt.zero_grad();
    auto loss = model->loss(idx, targets);
    loss.backward();
    opt.step();
    last = loss.item<double>();
  }
  EXPECT_LT(last, first - 2.0) << "first " << first << " last " << last;
}

TEST(GptModel, RejectsBadInputs) {
  const auto c = micro_config();
  Gpt model(c);
  const auto too_long = torch::zeros({1, c.block_size + 1}, torch::kLong);
  try {
    model->forward(too_long);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--seq_len"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model->forward(torch::zeros({4}, torch::kLong)), std::invalid_argument);
  EXPECT_THROW(model->forward(torch::zeros({1, 4}, torch::kInt)), std::invalid_argument);
  EXPECT_THROW(model->loss(torch::zeros({1, 4}, torch::kLong), torch::zeros({1, 5}, torch::kLong)),
               std::invalid_argument);
}

}  // namespace
}  // namespace gpt
