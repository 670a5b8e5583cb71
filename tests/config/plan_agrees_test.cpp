// `dscpp plan` and a real run agree: every config `plan` accepts, gpt-train (dscpp::initialize and one step) runs
// with the same batch and precision, and every config one refuses the other refuses naming the same key (issue 30).
// Both binaries are run as a user runs them, with no flags, so "auto" is filled by the one rule they share.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "../common/subprocess.h"

namespace {

namespace fs = std::filesystem;
using dscpp::testing::CommandResult;
using dscpp::testing::run_command;

fs::path dir() {
  static const fs::path d = dscpp::testing::temp_dir("plan_agrees");
  return d;
}

std::string write(const std::string& name, const nlohmann::json& config) {
  const fs::path path = dir() / (name + ".json");
  std::ofstream(path) << config.dump();
  return path.string();
}

CommandResult plan(const std::string& path) {
  return run_command(std::string(DSCPP_BINARY_DIR "/dscpp plan ") + path);
}

CommandResult train(const std::string& path) {
  return run_command("OMP_NUM_THREADS=1 " DSCPP_BINARY_DIR "/gpt-train --model tiny --n_layer 1 --seq_len 16 "
                     "--steps 1 --no_progress --deepspeed_config " + path);
}

// (train_batch_size, micro, accum) as each program prints it.
std::array<long, 3> batch_of(const std::string& text, const std::regex& pattern) {
  std::smatch m;
  if (!std::regex_search(text, m, pattern)) return {-1, -1, -1};
  return {std::stol(m[1]), std::stol(m[2]), std::stol(m[3])};
}

const std::regex kPlanBatch(R"(batch: train_batch_size (\d+) = train_micro_batch_size_per_gpu (\d+) x )"
                            R"(gradient_accumulation_steps (\d+))");
const std::regex kTrainBatch(R"(global batch (\d+) = micro (\d+) × accum (\d+))");

// Both accept, with the same batch triangle and the same compute dtype.
void expect_both_accept(const std::string& path) {
  const auto p = plan(path);
  const auto t = train(path);
  ASSERT_EQ(p.code, 0) << p.err;
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(batch_of(p.out, kPlanBatch), batch_of(t.err, kTrainBatch)) << p.out << "\n" << t.err;
  const auto resolved = nlohmann::json::parse(p.out.substr(0, p.out.find("\n\n")));
  const std::string dtype = resolved["bf16"]["enabled"] == true   ? "bf16"
                            : resolved["fp16"]["enabled"] == true ? "fp16"
                                                                  : "fp32";
  EXPECT_NE(t.err.find("; " + dtype + ";"), std::string::npos) << dtype << "\n" << t.err;
}

// Both refuse, each naming `key`.
void expect_both_refuse(const std::string& path, const std::string& key) {
  const auto p = plan(path);
  const auto t = train(path);
  EXPECT_NE(p.code, 0) << p.out;
  EXPECT_NE(t.code, 0) << t.err;
  EXPECT_NE(p.err.find(key), std::string::npos) << p.err;
  EXPECT_NE(t.err.find(key), std::string::npos) << t.err;
}

const nlohmann::json kBase = {{"train_micro_batch_size_per_gpu", 2},
                              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};

nlohmann::json with(const nlohmann::json& patch) {
  nlohmann::json config = kBase;
  config.merge_patch(patch);
  return config;
}

TEST(PlanAgrees, ChecksThatUsedToWaitForTheEngineAreTheConfigs) {
  expect_both_refuse(write("contiguous", with({{"activation_checkpointing",
                                                {{"contiguous_memory_optimization", true}}}})),
                     "activation_checkpointing.number_checkpoints");
  const fs::path nvme = dir() / "nvme";
  fs::create_directories(nvme);
  expect_both_refuse(
      write("aio_block", with({{"aio", {{"block_size", 1000}}},
                               {"zero_optimization", {{"stage", 2},
                                                      {"offload_optimizer",
                                                       {{"device", "nvme"}, {"nvme_path", nvme.string()}}}}}})),
      "aio.block_size");
  // What plan cannot check it names: the NVMe directory is the run's to find.
  const auto p = plan(write("nvme_ok", with({{"zero_optimization",
                                               {{"stage", 2},
                                                {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/nowhere"}}}}}})));
  ASSERT_EQ(p.code, 0) << p.err;
  EXPECT_NE(p.out.find("not checked by plan"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("zero_optimization.offload_optimizer.nvme_path '/nowhere'"), std::string::npos) << p.out;
}

TEST(PlanAgrees, AutoIsFilledTheSameWay) {
  // The micro-batch the config's numbers determine (32 / 8) is solved, not gpt-train's default 8.
  const auto solved = write("auto_micro", {{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", "auto"},
                                           {"gradient_accumulation_steps", 8}});
  expect_both_accept(solved);
  EXPECT_EQ(batch_of(plan(solved).out, kPlanBatch), (std::array<long, 3>{32, 4, 8}));
  // A batch left wholly to the program takes gpt-train's default micro-batch in both.
  const auto free_batch = write("auto_free", {{"train_micro_batch_size_per_gpu", "auto"},
                                              {"gradient_accumulation_steps", "auto"}});
  expect_both_accept(free_batch);
  EXPECT_EQ(batch_of(plan(free_batch).out, kPlanBatch), (std::array<long, 3>{8, 8, 1}));
  // No --fp16/--bf16: both "auto" enabled flags are false, as the HF Trainer fills them.
  expect_both_accept(write("auto_fp16", {{"train_batch_size", 8}, {"fp16", {{"enabled", "auto"}}},
                                         {"bf16", {{"enabled", "auto"}}}}));
}

TEST(PlanAgrees, EverySeedConfigWithItsAutosLeftIn) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(DSCPP_CONFIGS_DIR)) {
    if (entry.path().extension() != ".json") continue;
    ++count;
    SCOPED_TRACE(entry.path().filename().string());
    expect_both_accept(entry.path().string());
  }
  EXPECT_GE(count, 6);
}

TEST(PlanAgrees, DeepSpeedsSpellingsAndRefusals) {
  expect_both_accept(write("alias", with({{"zero_optimization", {{"stage", 3}, {"prefetch_bucket_size", 1000},
                                                                 {"max_live_parameters", 100000}}}})));
  expect_both_refuse(write("alias_twice", with({{"zero_optimization", {{"stage", 3}, {"prefetch_bucket_size", 1000},
                                                                       {"stage3_prefetch_bucket_size", 1000}}}})),
                     "zero_optimization.prefetch_bucket_size");
  expect_both_accept(write("seq_dtype", with({{"seq_parallel_communication_data_type", "bf16"}})));
  expect_both_refuse(write("seq_dtype_bad", with({{"seq_parallel_communication_data_type", "int8"}})),
                     "seq_parallel_communication_data_type");
  nlohmann::json clip_null = kBase;  // (not with(): a merge patch's null deletes the key)
  clip_null["gradient_clipping"] = nullptr;
  expect_both_refuse(write("clip_null", clip_null), "gradient_clipping = null");
  expect_both_refuse(write("random_ltd", with({{"data_efficiency", {{"enabled", false},
                                                                    {"data_routing",
                                                                     {{"random_ltd", {{"enabled", true}}}}}}}})),
                     "data_efficiency.data_routing.random_ltd.enabled");
}

}  // namespace
