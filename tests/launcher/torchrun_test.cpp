// torchrun as the launcher of a C++ program: its static rendezvous already serves the store on MASTER_PORT and says
// so (TORCHELASTIC_USE_AGENT_STORE=True), so every rank must connect as a client; a job restarted by --max_restarts
// starts again and runs through. Each run equals the same job started by hand (run_ranks), loss for loss.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../common/gpt_train_runs.h"

namespace {

namespace fs = std::filesystem;
using dscpp::testing::CommandResult;
using dscpp::testing::free_port;
using dscpp::testing::losses_in;
using dscpp::testing::read_text;
using dscpp::testing::run_command;
using dscpp::testing::run_ranks;
using dscpp::testing::temp_dir;

// torchrun of the torch we link.
const std::string kTorchrun = std::string(DSCPP_PYTHON) + " -m torch.distributed.run";

// Six steps of the tiny GPT under ZeRO-2 on 2 ranks, rank 0 writing its losses to `metrics`.
std::string gpt_train(const fs::path& metrics) {
  const nlohmann::json config = {{"train_batch_size", 8},
                                 {"zero_optimization", {{"stage", 2}}},
                                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  const auto config_file = metrics.parent_path() / "ds.json";
  std::ofstream(config_file) << config.dump();
  return std::string(DSCPP_BINARY_DIR) + "/gpt-train --no_progress --model tiny --seq_len 32 --steps 6 "
         "--deepspeed_config " + config_file.string() + " --metrics " + metrics.string();
}

std::vector<double> by_hand(const fs::path& dir) {
  const auto metrics = dir / "by_hand.jsonl";
  const auto ranks = run_ranks(2, gpt_train(metrics), "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=2");
  for (int r = 0; r < 2; ++r) EXPECT_EQ(ranks[r].code, 0) << "rank " << r << ":\n" << ranks[r].err;
  return losses_in(metrics);
}

CommandResult torchrun(const std::string& flags, const std::string& env, const fs::path& metrics) {
  return run_command("env OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=2 " + env + " " + kTorchrun +
                     " --nproc_per_node 2 --master_port " + std::to_string(free_port()) + " " +
                     flags + " --no_python " + gpt_train(metrics));
}

TEST(Torchrun, StartsCppRanksThatEqualTheSameJobStartedByHand) {
  const auto dir = temp_dir("torchrun");
  const auto want = by_hand(dir);
  ASSERT_EQ(want.size(), 6u);
  const auto result = torchrun("", "", dir / "torchrun.jsonl");
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(losses_in(dir / "torchrun.jsonl"), want);
}

// Rank 1 is killed before its third step in the first attempt; torchrun restarts both ranks, which meet again in
// the agent's store (under attempt 1's keys: comm/agent_store_test shows attempt 0's cannot count) and train from the
// start to the same losses.
TEST(Torchrun, ARestartedJobRunsThroughToTheSameLosses) {
  const auto dir = temp_dir("torchrun_restart");
  const auto want = by_hand(dir);
  const auto result = torchrun("--max_restarts 1", "DSCPP_KILL_AT=engine.step@3,rank=1", dir / "restarted.jsonl");
  ASSERT_EQ(result.code, 0) << result.err;
  // Rank 0 prints its start-up line once per attempt.
  size_t starts = 0;
  for (size_t at = 0; (at = result.err.find("ZeRO stage 2, world size 2", at)) != std::string::npos; ++at) ++starts;
  EXPECT_EQ(starts, 2u) << "expected a failed attempt and a restart:\n" << result.err;
  EXPECT_EQ(losses_in(dir / "restarted.jsonl"), want);
}

}  // namespace
