// gpt-train with MoE blocks: ep 2 on 2 processes (ZeRO-1 and -2, k = 1 and 2) gives the losses of every expert on one
// process (the same global batch accumulated there), activation checkpointing recomputes the same routing, and the
// flags' rules are named with their numbers.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "../common/gpt_train_runs.h"

namespace dscpp::testing {
namespace {

// No random routing (RTS, 2nd-expert sampling), so the runs route alike; clipping at 1.0 so the norm counts.
std::vector<nlohmann::json> moe_run(int world, int stage, const std::string& flags) {
  return gpt_train_metrics(world,
                           {{"train_batch_size", 8}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_clipping", 1.0},
                            {"zero_optimization", {{"stage", stage}}},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}},
                           "--moe_use_rts false --moe_top2_2nd_expert_sampling false " + flags);
}

TEST(GptTrainMoE, ExpertParallelGivesTheOneProcessLosses) {
  for (int k : {1, 2}) {
    const std::string moe = "--moe_experts 4 --moe_top_k " + std::to_string(k) + " ";
    const auto one = moe_run(1, 0, moe);
    ASSERT_EQ(one.size(), 20u);
    EXPECT_GT(std::abs(one[0]["loss"].get<double>() - moe_run(1, 0, "")[0]["loss"].get<double>()), 1e-4)
        << "the MoE blocks must change the model";
    const int stage = k == 1 ? 1 : 2;
    SCOPED_TRACE("k " + std::to_string(k) + ", ZeRO-" + std::to_string(stage));
    expect_same_trajectory(moe_run(2, stage, moe + "--ep_size 2"), one);
  }
}

// Checkpointed MoE blocks recompute in backward with the forward's random draws — RTS, Jitter and 2nd-expert sampling
// all on — so they route the same tokens, and their aux loss (weighted 1.0 here, so its gradient counts) still
// reaches the gates: the run equals the one without checkpointing. The profile's count proves the blocks were
// checkpointed: 4 blocks × 20 steps on each rank.
TEST(GptTrainMoE, ActivationCheckpointingRecomputesTheSameRouting) {
  const nlohmann::json config = {{"train_batch_size", 8}, {"train_micro_batch_size_per_gpu", 4},
                                 {"gradient_clipping", 1.0}, {"steps_per_print", 20},
                                 {"zero_optimization", {{"stage", 2}}},
                                 {"activation_checkpointing", {{"profile", true}}},
                                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  const std::string moe = "--moe_experts 4 --moe_top_k 2 --ep_size 2 --moe_noisy_gate_policy Jitter "
                          "--moe_loss_coeff 1.0";
  const auto without = gpt_train_run(2, config, moe);
  const auto with = gpt_train_run(2, config, moe + " --activation_checkpointing");
  ASSERT_EQ(without.rows.size(), 20u);
  expect_same_trajectory(with.rows, without.rows);
  EXPECT_NE(with.log.find("activation checkpointing: 80 checkpoints, 80 recomputes"), std::string::npos) << with.log;
}

TEST(GptTrainMoE, TheFlagsRulesAreNamed) {
  const std::string gpt = std::string(DSCPP_BINARY_DIR) + "/gpt-train --no_progress --model tiny --steps 1 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--moe_experts 6 --ep_size 4", "--moe_experts 6 is not divisible by --ep_size 4"},
      {"--moe_experts 4 --ep_size 4", "MoE ep_size 4 must divide the data-parallel size 2"},
      {"--moe_experts 4 --moe_top_k 3", "MoE k is 3; it must be 1 or 2"},
      {"--moe_experts 4 --moe_capacity_factor 0", "MoE capacity_factor is 0; it must be > 0"},
      {"--moe_experts 4 --moe_noisy_gate_policy Gaussian",
       "noisy_gate_policy \"Gaussian\" is not one of None, Jitter, RSample"},
      {"--ep_size 2", "--ep_size 2 needs --moe_experts"},
  };
  expect_gpt_train_refuses(gpt, cases);
}

}  // namespace
}  // namespace dscpp::testing
