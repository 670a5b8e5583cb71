// Generation from the GPT (model/generation.h): the cached forward against recomputing the whole sequence, prompts
// of unequal length against each alone, HF's top-k / top-p filter, seeded sampling, end tokens, bad input named.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "model/generation.h"
#include "model/gpt.h"

namespace gpt {
namespace {

GptConfig generation_config() {
  GptConfig c;
  c.vocab_size = 53;
  c.block_size = 24;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  return c;
}

Gpt seeded_model() {
  torch::manual_seed(11);
  Gpt model(generation_config());
  model->eval();
  return model;
}

// Greedy without a cache: the whole sequence through forward() for every new token.
std::vector<int64_t> greedy_recomputing(Gpt& model, std::vector<int64_t> tokens, int64_t n) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const auto logits = model->forward(torch::tensor(tokens, torch::kLong).view({1, -1}));
    out.push_back(logits[0][-1].argmax().item<int64_t>());
    tokens.push_back(out.back());
  }
  return out;
}

const std::vector<std::vector<int64_t>> kPrompts = {{3, 14, 15, 9, 26, 5}, {35, 8}, {47}};

TEST(GptGeneration, CachedGreedyEqualsRecomputingAndUnequalPromptsEqualEachAlone) {
  auto model = seeded_model();
  GenerateOptions greedy;
  greedy.max_new_tokens = 10;
  const auto batched = generate(*model, kPrompts, greedy);
  ASSERT_EQ(batched.size(), kPrompts.size());
  for (size_t r = 0; r < kPrompts.size(); ++r) {
    EXPECT_EQ(batched[r], greedy_recomputing(model, kPrompts[r], 10)) << "prompt " << r;
    EXPECT_EQ(generate(*model, {kPrompts[r]}, greedy)[0], batched[r]) << "prompt " << r << " alone";
  }
}

TEST(GptGeneration, CachedLogitsEqualTheWholeForwardsPosition) {
  // A left-padded row's logits at each step are the unpadded sequence's through forward(), within fp32 rounding.
  auto model = seeded_model();
  torch::NoGradGuard no_grad;
  KvCache cache;
  auto idx = torch::tensor({0, 0, 0, 35, 8, 0, 0, 12, 4, 47}, torch::kLong).view({2, 5});
  auto valid = idx.ne(0);
  auto logits = model->forward_cached(idx, valid, cache);
  std::vector<std::vector<int64_t>> rows = {{35, 8}, {12, 4, 47}};
  for (int step = 0; step < 4; ++step) {
    for (int r = 0; r < 2; ++r) {
      const auto whole = model->forward(torch::tensor(rows[r], torch::kLong).view({1, -1}))[0][-1];
      EXPECT_LT((logits[r] - whole).abs().max().item<double>(), 1e-5) << "row " << r << ", step " << step;
    }
    const auto next = logits.argmax(-1);
    for (int r = 0; r < 2; ++r) rows[r].push_back(next[r].item<int64_t>());
    logits = model->forward_cached(next.view({2, 1}), torch::ones({2, 1}, torch::kBool), cache);
  }
  EXPECT_EQ(cache.length(), 9);
  EXPECT_EQ(cache.layers.size(), 2u);
  EXPECT_EQ(cache.layers[0].keys.size(2), 9);
}

TEST(GptGeneration, TopKAndTopPKeepWhatHfKeeps) {
  // probabilities 0.5, 0.3, 0.15, 0.05 (in another order): top-p 0.75 keeps 0.5 and 0.3 (HF removes the tokens whose
  // ascending cumulative probability is at most 0.25), top-k 3 the three largest; the most likely always stays.
  const auto logits = torch::tensor({0.15, 0.5, 0.05, 0.3}, torch::kDouble).log().view({1, 4});
  auto kept = [](const torch::Tensor& t) { return t.isfinite().view({-1}).to(torch::kLong); };
  EXPECT_TRUE(torch::equal(kept(filter_logits(logits, 0, 0.75)), torch::tensor({0, 1, 0, 1}, torch::kLong)));
  EXPECT_TRUE(torch::equal(kept(filter_logits(logits, 3, 1.0)), torch::tensor({1, 1, 0, 1}, torch::kLong)));
  EXPECT_TRUE(torch::equal(kept(filter_logits(logits, 0, 1e-9)), torch::tensor({0, 1, 0, 0}, torch::kLong)));
  EXPECT_TRUE(torch::equal(kept(filter_logits(logits, 3, 0.6)), torch::tensor({0, 1, 0, 1}, torch::kLong)));
  EXPECT_TRUE(torch::equal(kept(filter_logits(logits, 0, 1.0)), torch::tensor({1, 1, 1, 1}, torch::kLong)));
}

TEST(GptGeneration, SamplingIsSeededAndItsLimitsAreGreedy) {
  auto model = seeded_model();
  GenerateOptions greedy;
  greedy.max_new_tokens = 8;
  GenerateOptions sampled = greedy;
  sampled.temperature = 1.5;
  sampled.seed = 5;
  const auto a = generate(*model, kPrompts, sampled), b = generate(*model, kPrompts, sampled);
  EXPECT_EQ(a, b);  // its own generator: the same seed draws the same tokens
  sampled.seed = 6;
  EXPECT_NE(generate(*model, kPrompts, sampled), a);
  EXPECT_NE(a, generate(*model, kPrompts, greedy));
  sampled.top_k = 1;  // one candidate: the most likely
  EXPECT_EQ(generate(*model, kPrompts, sampled), generate(*model, kPrompts, greedy));
  sampled.top_k = 0;
  sampled.top_p = 1e-9;
  EXPECT_EQ(generate(*model, kPrompts, sampled), generate(*model, kPrompts, greedy));
  EXPECT_TRUE(model->is_training() == false);
  model->train();
  generate(*model, kPrompts, greedy);
  EXPECT_TRUE(model->is_training());  // put back as it was
}

// `tokens` up to and including the first `eos`.
std::vector<int64_t> up_to(const std::vector<int64_t>& tokens, int64_t eos) {
  std::vector<int64_t> out;
  for (const int64_t t : tokens) {
    out.push_back(t);
    if (t == eos) break;
  }
  return out;
}

TEST(GptGeneration, ARowEndsAtTheEndTokenAndTheOthersGoOn) {
  // Sampled (an untrained model's greedy choice repeats one token): a row's draws do not depend on another row's
  // tokens, so the other rows go on as without the end token.
  auto model = seeded_model();
  GenerateOptions sampled;
  sampled.max_new_tokens = 6;
  sampled.temperature = 1.0;
  sampled.seed = 3;
  const auto free = generate(*model, kPrompts, sampled);
  // The end token: the first row's first token that did not come before it, after its first (so the row ends early).
  size_t k = 1;
  while (k < free[0].size() && up_to(free[0], free[0][k]).size() != k + 1) ++k;
  ASSERT_LT(k, free[0].size()) << "the first row repeats one token; pick another seed";
  sampled.eos_token = free[0][k];
  const auto ended = generate(*model, kPrompts, sampled);
  EXPECT_EQ(ended[0].size(), k + 1);
  for (size_t r = 0; r < kPrompts.size(); ++r) EXPECT_EQ(ended[r], up_to(free[r], *sampled.eos_token)) << "row " << r;
}

TEST(GptGeneration, BadInputIsNamed) {
  auto model = seeded_model();
  GenerateOptions o;
  auto fails = [&](const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& options,
                   const std::string& words) {
    try {
      generate(*model, prompts, options);
      ADD_FAILURE() << "no error; expected one naming: " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  fails({}, o, "no prompts");
  fails({{1, 2}, {}}, o, "prompt 1 is empty");
  fails({{1, 53}}, o, "holds token 53, outside the vocabulary [0, 53)");
  o.max_new_tokens = 21;  // the last new token is never fed back: 5 + 20 positions
  fails({{1, 2, 3, 4, 5}}, o, "need 25 positions, more than block_size 24");
  o.max_new_tokens = 20;
  EXPECT_EQ(generate(*model, {{1, 2, 3, 4, 5}}, o)[0].size(), 20u);  // exactly block_size positions
  o.max_new_tokens = 4;
  o.top_p = 0;
  fails({{1}}, o, "top_p must be in (0, 1]");
  o.top_p = 1;
  o.eos_token = 99;
  fails({{1}}, o, "eos_token 99 is outside the vocabulary");
}

}  // namespace
}  // namespace gpt
