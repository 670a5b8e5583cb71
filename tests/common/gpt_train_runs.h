// gpt-train trajectories for the layout tests (tensor and pipeline parallelism against one process): the tiny GPT,
// 20 steps at seq 32 on `world` real processes, and the per-step comparison they all make.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "multiprocess.h"

namespace dscpp::testing {

// What one gpt-train run left: rank 0's metrics rows (one per step) and its log (stderr).
struct GptTrainRun {
  std::vector<nlohmann::json> rows;
  std::string log;
};

// gpt-train --model tiny --seq_len 32 --steps 20 with `config` (written to a file) and `flags`, as `world` ranks;
// every rank must exit 0.
inline GptTrainRun gpt_train_run(int world, const nlohmann::json& config, const std::string& flags) {
  const auto dir = temp_dir("gpt_train_" + std::to_string(world) + "_" +
                            std::to_string(std::hash<std::string>()(config.dump() + flags)));
  const auto config_file = dir / "ds.json";
  std::ofstream(config_file) << config.dump();
  const auto metrics = dir / "metrics.jsonl";
  const auto ranks = run_ranks(world,
                               std::string(DSCPP_BINARY_DIR) + "/gpt-train --no_progress --model tiny --seq_len 32 "
                               "--steps 20 --deepspeed_config " + config_file.string() + " --metrics " +
                                   metrics.string() + " " + flags,
                               "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=2");
  for (int r = 0; r < world; ++r) EXPECT_EQ(ranks[r].code, 0) << "rank " << r << ":\n" << ranks[r].err;
  GptTrainRun run;
  run.log = ranks.at(0).err;
  std::istringstream in(read_text(metrics));
  for (std::string line; std::getline(in, line);) run.rows.push_back(nlohmann::json::parse(line));
  return run;
}

// gpt_train_run's metrics rows.
inline std::vector<nlohmann::json> gpt_train_metrics(int world, const nlohmann::json& config,
                                                     const std::string& flags) {
  return gpt_train_run(world, config, flags).rows;
}

// gpt_train_metrics with the config the layout tests share: global batch 8 of micro-batches of 4, clipping at 1.0,
// AdamW at lr 1e-3, ZeRO `stage`.
inline std::vector<nlohmann::json> gpt_train_adamw(int world, int stage, const std::string& flags) {
  return gpt_train_metrics(world,
                           {{"train_batch_size", 8}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_clipping", 1.0},
                            {"zero_optimization", {{"stage", stage}}},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}},
                           flags);
}

// Each (flags, message): `gpt` + flags on 2 ranks stops both with exit code 1 and the message on stderr.
inline void expect_gpt_train_refuses(const std::string& gpt,
                                     const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [flags, message] : cases) {
    const auto ranks = run_ranks(2, gpt + flags, "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=1");
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ranks[r].code, 1) << flags;
      EXPECT_NE(ranks[r].err.find(message), std::string::npos) << flags << ": " << ranks[r].err;
    }
  }
}

// The "loss" of every row of a gpt-train --metrics file, in order.
inline std::vector<double> losses_in(const std::filesystem::path& metrics) {
  std::vector<double> out;
  std::istringstream in(read_text(metrics));
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

// Per step: the loss within 1e-5 and the gradient norm within 1e-3 of itself. The norm is a sum over every gradient,
// each computed in another order in a split layout (sums over heads, MLP width and vocabulary split in p; a tied
// weight's halves summed apart); at loss spikes that moves it by up to 3e-4 of itself (measured: step 15 of the plain
// run, step 20 with dropout). The engine tests check its counting at 1e-5.
inline void expect_same_trajectory(const std::vector<nlohmann::json>& got, const std::vector<nlohmann::json>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    EXPECT_NEAR(got[k]["loss"].get<double>(), want[k]["loss"].get<double>(), 1e-5) << "step " << k + 1;
    EXPECT_NEAR(got[k]["grad_norm"].get<double>(), want[k]["grad_norm"].get<double>(),
                1e-3 * want[k]["grad_norm"].get<double>())
        << "step " << k + 1;
  }
}

}  // namespace dscpp::testing
