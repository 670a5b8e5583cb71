// The flops profiler's counts on the GPT model equal the analytic matrix-product FLOPs: per block
// 24·B·T·C² (q/k/v, output projection, the two MLP layers) + 4·B·T²·C (q·kᵀ and the weights·v), and the tied head
// 2·B·T·C·V.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dscpp/monitor/flops_profiler.h"
#include "model/gpt.h"

namespace {

int64_t block_flops(int64_t B, int64_t T, int64_t C) { return 24 * B * T * C * C + 4 * B * T * T * C; }

TEST(GptFlops, OneBlockIsTheAnalyticCount) {
  gpt::GptConfig config;
  config.n_embd = 64;
  config.n_head = 4;
  gpt::Block block(config);
  const int64_t B = 2, T = 16, C = 64;
  auto x = torch::randn({B, T, C});
  dscpp::FlopsCounter counter;
  block->forward(x);
  EXPECT_EQ(counter.total(), block_flops(B, T, C));
}

TEST(GptFlops, WholeModelByModuleScopeAndNothingFromBackward) {
  gpt::GptConfig config;  // 4 blocks of 128, vocabulary 256
  gpt::Gpt model(config);
  const int64_t B = 3, T = 32, C = config.n_embd, V = config.vocab_size;
  model->set_block_runner([&](const gpt::Block& block, const torch::Tensor& x) {
    dscpp::FlopsCounter::Scope scope("block");
    return block.ptr()->forward(x);
  });
  const auto idx = torch::randint(V, {B, T}, torch::kLong);
  dscpp::FlopsCounter counter;
  auto loss = model->loss(idx, idx);
  const int64_t forward = counter.total();
  loss.backward();  // backward ops are not forward FLOPs
  EXPECT_EQ(counter.total(), forward);
  EXPECT_EQ(forward, config.n_layer * block_flops(B, T, C) + 2 * B * T * C * V);
  EXPECT_EQ(forward, B * config.forward_flops(T)) << "gpt-train's MFU uses this count";
  EXPECT_EQ(counter.by_module().at("block"), config.n_layer * block_flops(B, T, C));
  EXPECT_EQ(counter.by_module().at("(model)"), 2 * B * T * C * V);
}

// An MoE block's experts run on their capacity's rows, not on every token: top-2 over 8 experts at capacity factor 1
// runs 2 MLPs' worth per token, and the count is the active FLOPs gpt-train's MFU uses — not the 8 MLPs per token a
// dense dispatch (every expert over every token) would count.
TEST(GptFlops, MoEBlocksCountTheActiveExpertsOnly) {
  gpt::GptConfig config;  // 4 blocks of 128: MoE in blocks 1 and 3
  config.moe_experts = 8;
  config.moe_top_k = 2;
  gpt::MoeSettings moe;
  moe.gate.k = 2;
  moe.gate.use_rts = false;
  moe.gate.top2_2nd_expert_sampling = false;
  gpt::Gpt model(config, gpt::GptImpl::BlockBuilt{}, nullptr, moe);
  const int64_t B = 2, T = 32, C = config.n_embd;  // 64 tokens: capacity ceil(64 / 8 · 2) = 16, 8 · 16 rows = 2 · 64
  const auto idx = torch::randint(config.vocab_size, {B, T}, torch::kLong);
  dscpp::FlopsCounter counter;
  model->loss(idx, idx);
  EXPECT_EQ(counter.total(), B * config.forward_flops(T));
  const int64_t mlp = 16 * B * T * C * C, all_experts = config.moe_experts * mlp;
  EXPECT_LT(counter.total(), 2 * all_experts) << "every expert over every token would be counted";
}

TEST(GptFlops, CountsOnlyWhileAlive) {
  auto a = torch::randn({8, 8});
  {
    dscpp::FlopsCounter counter;
    torch::mm(a, a);
    EXPECT_EQ(counter.total(), 2 * 8 * 8 * 8);
  }
  dscpp::FlopsCounter later;
  EXPECT_EQ(later.total(), 0);
}

}  // namespace
