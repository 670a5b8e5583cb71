// gpt-train --sparse_attention: the dense layout gives plain causal attention's losses; a BigBird layout (random
// blocks from --seed through Python's random, one layout per head) changes them, and sliced over 2 tensor-parallel
// ranks (each keeping its heads' layouts) with ZeRO-1 gives the one-process run's; what it refuses.
#include <gtest/gtest.h>

#include "../common/gpt_train_runs.h"

namespace dscpp::testing {
namespace {

nlohmann::json with_sparse_attention(int stage, const nlohmann::json& section) {
  return {{"train_batch_size", 8},           {"train_micro_batch_size_per_gpu", 4},
          {"gradient_clipping", 1.0},        {"zero_optimization", {{"stage", stage}}},
          {"sparse_attention", section},     {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
}

TEST(SparseAttentionGpt, DenseLayoutGivesPlainAttentionsLosses) {
  expect_same_trajectory(gpt_train_adamw(1, 0, "--sparse_attention dense"), gpt_train_adamw(1, 0, ""));
}

TEST(SparseAttentionGpt, BigBirdActsAndSlicesOverTensorParallelRanksAsOneProcess) {
  const nlohmann::json bigbird = {{"mode", "bigbird"},          {"block", 8},
                                  {"attention", "unidirectional"}, {"num_random_blocks", 1},
                                  {"different_layout_per_head", true}};
  const auto one = gpt_train_metrics(1, with_sparse_attention(0, bigbird), "");
  ASSERT_EQ(one.size(), 20u);
  EXPECT_GT(std::abs(one[0]["loss"].get<double>() - gpt_train_adamw(1, 0, "")[0]["loss"].get<double>()), 1e-4)
      << "the layout must change the attention";
  expect_same_trajectory(gpt_train_metrics(2, with_sparse_attention(1, bigbird), "--tensor_parallel 2"), one);
}

TEST(SparseAttentionGpt, NamesWhatItRefuses) {
  const std::string gpt = std::string(DSCPP_BINARY_DIR) + "/gpt-train --no_progress --model tiny --steps 1 ";
  expect_gpt_train_refuses(
      gpt, {{"--sparse_attention fixed --dropout 0.1", "sparse_attention with --dropout"},
            {"--sparse_attention fixed --seq_len 24", "the sequence length 24 must be divisible by the block size 16"},
            {"--sparse_attention sparse", "sparse_attention.mode"},
            {"--sparse_attention fixed --sequence_parallel 2", "sparse_attention with sequence parallelism"}});
}

}  // namespace
}  // namespace dscpp::testing
