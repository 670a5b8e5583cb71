// 3D checkpoints: gpt-train over pipeline stages and tensor-parallel slices saves one checkpoint of the whole model
// (each stage its layers, each slice as part of its whole named parameter, the tied embedding once), which resumes
// on one process as the uninterrupted run goes on; and a one-process checkpoint resumes pipelined and sliced. Both
// consolidate to the same whole weights. Real processes over loopback.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "../common/multiprocess.h"
#include "dscpp/checkpoint/consolidate.h"
#include "dscpp/checkpoint/manifest.h"
#include "dscpp/checkpoint/safetensors.h"

namespace dscpp::testing {
namespace {

constexpr int kSteps = 8, kSaveAt = 4;

// The same run in every layout: the tiny GPT, global batch 8 in 2 micro-batches (a pipeline's), clipping at 1.
std::filesystem::path write_config(const std::filesystem::path& dir) {
  const nlohmann::json config = {{"train_batch_size", 8},
                                 {"gradient_accumulation_steps", 2},
                                 {"gradient_clipping", 1.0},
                                 {"zero_optimization", {{"stage", 0}}},
                                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  const auto file = dir / "ds.json";
  std::ofstream(file) << config.dump();
  return file;
}

// gpt-train on `world` ranks with `flags`; every rank must exit 0. Rank 0's metrics rows, one per step it ran.
std::vector<nlohmann::json> gpt_train(int world, const std::filesystem::path& dir, const std::string& name,
                                      const std::string& flags) {
  const auto metrics = dir / (name + ".jsonl");
  const auto ranks = run_ranks(world,
                               std::string(DSCPP_BINARY_DIR) + "/gpt-train --no_progress --model tiny --seq_len 32 "
                               "--deepspeed_config " + write_config(dir).string() + " --metrics " + metrics.string() +
                                   " " + flags,
                               "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=2");
  for (int r = 0; r < world; ++r) EXPECT_EQ(ranks[r].code, 0) << name << ", rank " << r << ":\n" << ranks[r].err;
  std::vector<nlohmann::json> rows;
  std::istringstream in(read_text(metrics));
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// The resumed run's steps kSaveAt + 1 … kSteps against the uninterrupted run's: the loss within 1e-5.
void expect_continues(const std::vector<nlohmann::json>& resumed, const std::vector<nlohmann::json>& whole) {
  ASSERT_EQ(whole.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(resumed.size(), static_cast<size_t>(kSteps - kSaveAt));
  for (int k = 0; k < kSteps - kSaveAt; ++k) {
    EXPECT_NEAR(resumed[k]["loss"].get<double>(), whole[kSaveAt + k]["loss"].get<double>(), 1e-5)
        << "step " << kSaveAt + k + 1;
  }
}

std::map<std::string, torch::Tensor> consolidated(const std::filesystem::path& checkpoint,
                                                  const std::filesystem::path& out) {
  consolidate(checkpoint.string(), out.string(), {});
  return read_safetensors((out / "model.safetensors").string());
}

const std::string kLayout = "--pipeline_parallel 2 --tensor_parallel 2";

TEST(Checkpoint3D, PipelinedAndSlicedResumesOnOneProcessAndTheOtherWayRound) {
  const auto dir = temp_dir("checkpoint_3d");
  const auto whole = gpt_train(1, dir, "whole", "--steps " + std::to_string(kSteps));

  // pp 2 x tp 2 → 1 process.
  const auto sliced_ckpt = dir / "sliced";
  gpt_train(4, dir, "sliced", kLayout + " --steps " + std::to_string(kSaveAt) + " --save_dir " + sliced_ckpt.string());
  const auto m = Manifest::read((sliced_ckpt / ("global_step" + std::to_string(kSaveAt))).string());
  EXPECT_EQ(m.world_size, 4);
  EXPECT_EQ(m.pipeline_parallel, 2);
  EXPECT_EQ(m.tensor_parallel, 2);
  SCOPED_TRACE("pp 2 x tp 2 checkpoint resumed on 1 process");
  expect_continues(gpt_train(1, dir, "from_sliced", "--steps " + std::to_string(kSteps) + " --load_dir " +
                                                         sliced_ckpt.string()),
                   whole);

  // 1 process → pp 2 x tp 2.
  const auto whole_ckpt = dir / "whole_ckpt";
  gpt_train(1, dir, "whole_saved", "--steps " + std::to_string(kSaveAt) + " --save_dir " + whole_ckpt.string());
  SCOPED_TRACE("1-process checkpoint resumed as pp 2 x tp 2");
  expect_continues(gpt_train(4, dir, "to_sliced", kLayout + " --steps " + std::to_string(kSteps) + " --load_dir " +
                                                      whole_ckpt.string()),
                   whole);

  // Both consolidate to the whole model: the same names and shapes, and the same values up to the layouts' rounding.
  // Adam turns a rounding-sized difference in a near-zero gradient into up to an lr-sized one in the weight, so an
  // element may differ by up to lr = 1e-3 after 4 steps (measured: 1.1e-5 at most); the mean stays at rounding size
  // (measured: up to 1.2e-7 a parameter with torch 2.11's kernels). A slice written to the wrong place differs by the
  // weights' own size (N(0, 0.02) here, a mean of ~0.016) in most of its elements.
  const auto a = consolidated(sliced_ckpt, dir / "sliced_out"), b = consolidated(whole_ckpt, dir / "whole_out");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, value] : b) {
    ASSERT_TRUE(a.count(name)) << name;
    ASSERT_EQ(a.at(name).sizes(), value.sizes()) << name;
    const auto diff = (a.at(name) - value).abs();
    EXPECT_LT(diff.max().item<double>(), 1e-3) << name;
    EXPECT_LT(diff.mean().item<double>(), 1e-6) << name;
  }
}

}  // namespace
}  // namespace dscpp::testing
