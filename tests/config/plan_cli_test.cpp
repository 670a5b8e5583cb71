// `dscpp plan` end to end: runs the built binary on configs and checks exit codes, messages and the schedule CSV.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../common/subprocess.h"
#include "dscpp/config/config.h"

namespace {

namespace fs = std::filesystem;

using dscpp::testing::CommandResult;
using PlanRun = CommandResult;

fs::path temp_dir() {
  static const fs::path dir = dscpp::testing::temp_dir("plan");
  return dir;
}

PlanRun plan(const std::string& args) {
  return dscpp::testing::run_command(std::string(DSCPP_BINARY_DIR "/dscpp plan ") + args);
}

std::string write_config(const std::string& name, const nlohmann::json& config) {
  const fs::path path = temp_dir() / name;
  std::ofstream(path) << config.dump();
  return path.string();
}

const std::string kUserFlags =
    " --world_size 2 --micro_batch 4 --grad_accum 2 --lr 3e-4 --weight_decay 0.01 --warmup_steps 10"
    " --total_steps 100 --hidden_size 768 --clip 1.0";

TEST(PlanCli, EverySharedConfigIsAccepted) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(DSCPP_CONFIGS_DIR)) {
    if (entry.path().extension() != ".json") continue;
    ++count;
    for (const char* precision : {" --fp16", " --bf16"}) {
      PlanRun r = plan(entry.path().string() + kUserFlags + precision + " --params 124M");
      EXPECT_EQ(r.code, 0) << entry.path() << "\n" << r.err;
      EXPECT_NE(r.out.find("batch: train_batch_size"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("model-state memory per rank"), std::string::npos) << r.out;
      EXPECT_EQ(r.out.find("\"auto\""), std::string::npos) << r.out;
      EXPECT_EQ(r.err, "") << entry.path();
    }
  }
  EXPECT_GE(count, 6);
}

TEST(PlanCli, ResolvedJsonAndSetOverrides) {
  std::string path = write_config("set.json", {{"train_micro_batch_size_per_gpu", 2}});
  PlanRun r = plan(path + " --world_size 4 --set zero_optimization.stage=3 --set optimizer.type=AdamW"
                      " --set optimizer.params.betas=[0.8,0.9] --set gradient_accumulation_steps=2");
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t end = r.out.find("\n\nbatch:");
  ASSERT_NE(end, std::string::npos) << r.out;
  nlohmann::json resolved = nlohmann::json::parse(r.out.substr(0, end));
  EXPECT_EQ(resolved["zero_optimization"]["stage"], 3);
  EXPECT_EQ(resolved["zero_optimization"]["overlap_comm"], true);
  EXPECT_EQ(resolved["optimizer"]["type"], "AdamW");
  EXPECT_EQ(resolved["optimizer"]["params"]["betas"], nlohmann::json({0.8, 0.9}));
  EXPECT_EQ(resolved["train_batch_size"], 16);
  EXPECT_NE(r.out.find("train_batch_size 16 = train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 2 x "
                       "data-parallel size 4\n"),
            std::string::npos);
}

TEST(PlanCli, TypoWarnsWithSuggestion) {
  std::string path = write_config("typo.json", {{"train_batch_size", 8}, {"gradient_acumulation_steps", 2}});
  PlanRun r = plan(path);
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.err.find("did you mean 'gradient_accumulation_steps'?"), std::string::npos) << r.err;
}

// Errors are one line: "error: <file>: <message>".
void expect_error(const PlanRun& r, const std::string& path, const std::string& needle) {
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.err.rfind("error: " + path + ": ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

// `plan` says no to exactly what dscpp::initialize says no to: both go through Config::from_json, whose
// check_supported is the one list (the engine runs it again on Configs built in code). Each rejected config's
// message from `plan` is the parser's, word for word.
TEST(PlanCli, RejectsWhatInitializeRejects) {
  const nlohmann::json base = {{"train_micro_batch_size_per_gpu", 2},
                               {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  const std::vector<std::pair<std::string, nlohmann::json>> rejected = {
      {"fp16.auto_cast", {{"fp16", {{"enabled", true}, {"auto_cast", true}}}}},
      {"wandb.enabled", {{"wandb", {{"enabled", true}}}}},
      {"zero_optimization.round_robin_gradients", {{"zero_optimization", {{"stage", 2}, {"round_robin_gradients", true}}}}},
      {"zero_optimization.offload_optimizer.ratio",
       {{"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.3}}}}}}},
      {"zero_optimization.offload_optimizer",
       {{"optimizer", {{"type", "Lamb"}, {"params", {{"lr", 1e-3}}}}},
        {"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}}}}},
      {"zero_optimization.offload_optimizer.device", {{"zero_optimization", {{"stage", 0}, {"offload_optimizer", {{"device", "cpu"}}}}}}},
      {"data_types.grad_accum_dtype", {{"bf16", {{"enabled", true}}}, {"data_types", {{"grad_accum_dtype", "fp32"}}}}},
      {"zero_optimization.zero_hpz_partition_size", {{"zero_optimization", {{"stage", 2}, {"zero_hpz_partition_size", 8}}}}},
      {"sparse_attention.num_local_blocks", {{"sparse_attention", {{"mode", "bigbird"}, {"num_local_blocks", 4}}}}},
      {"zero_optimization.stage3_prefetch_bucket_sise",
       {{"zero_optimization", {{"stage", 3}, {"stage3_prefetch_bucket_sise", 1000}}}}},
  };
  for (const auto& [key, patch] : rejected) {
    nlohmann::json config = base;
    config.merge_patch(patch);
    const std::string path = write_config("rejected_" + key + ".json", config);
    std::string parser_error;
    try {
      dscpp::Config::from_file(path);
    } catch (const dscpp::ConfigError& e) {
      parser_error = e.what();
    }
    EXPECT_NE(parser_error.find(key), std::string::npos) << key << ": " << parser_error;
    const PlanRun r = plan(path);
    EXPECT_NE(r.code, 0) << key;
    EXPECT_EQ(r.err, "error: " + parser_error + "\n") << key;
  }
}

TEST(PlanCli, ModelPresetGivesTheParameterCount) {
  const std::string path = write_config("model.json", {{"train_micro_batch_size_per_gpu", 2},
                                                        {"zero_optimization", {{"stage", 3}}}});
  const PlanRun r = plan(path + " --model gpt2 --world_size 4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("model: gpt-train --model gpt2: 124439808 params (12 layers, 768 wide, 12 heads, vocab 50257"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model-state memory per rank (Adam, 124439808 params"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the config names no optimizer"), std::string::npos) << r.out;
  // A configured optimizer's own state: Lion keeps one fp32 tensor per parameter, a quarter of it per rank at ZeRO 3.
  const std::string lion = write_config("lion.json", {{"train_micro_batch_size_per_gpu", 2},
                                                      {"optimizer", {{"type", "Lion"}, {"params", {{"lr", 1e-4}}}}},
                                                      {"zero_optimization", {{"stage", 3}}}});
  const PlanRun l = plan(lion + " --model gpt2 --world_size 4");
  ASSERT_EQ(l.code, 0) << l.err;
  EXPECT_NE(l.out.find("model-state memory per rank (Lion, 124439808 params"), std::string::npos) << l.out;
  EXPECT_EQ(l.out.find("the config names no optimizer"), std::string::npos) << l.out;
  EXPECT_NE(plan(path + " --model gpt5").err.find("unknown preset 'gpt5'"), std::string::npos);
  EXPECT_NE(plan(path + " --model gpt2 --params 1B").code, 0);  // one or the other
}

// --world_size is the job's ranks, as gpt-train's world: the batch triangle's third side is the data-parallel size,
// world / (pipeline × tensor), as in gpt-train and DeepSpeed, and a world the layout does not divide is refused with
// the words gpt-train refuses it with (both build the same ProcessTopology).
TEST(PlanCli, ModelParallelAxesDivideTheWorldAsTrainingDoes) {
  const std::string path = write_config("3d.json", {{"train_batch_size", 16},
                                                     {"train_micro_batch_size_per_gpu", 2},
                                                     {"gradient_accumulation_steps", 8},
                                                     {"zero_optimization", {{"stage", 1}}},
                                                     {"pipeline", {{"stages", 2}}},
                                                     {"tensor_parallel", {{"autotp_size", 2}}}});
  const PlanRun r = plan(path + " --world_size 4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("train_batch_size 16 = train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 8 x "
                       "data-parallel size 1 (world_size 4 / (pipeline 2 x tensor 2))"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("grid: 4 ranks = pipeline 2 x data parallel 1 x tensor parallel 2"), std::string::npos) << r.out;

  // ProcessTopology's message (src/comm/topology.cpp), which gpt-train stops with at the same world.
  const std::string words = "topology: pipeline stages 1 x tensor-parallel size 2 = 2 does not divide the world size 1";
  const std::string tp = write_config("tp_world1.json", {{"train_micro_batch_size_per_gpu", 2},
                                                          {"tensor_parallel", {{"autotp_size", 2}}}});
  const PlanRun one = plan(tp + " --world_size 1");
  EXPECT_NE(one.code, 0);
  EXPECT_NE(one.err.find(words), std::string::npos) << one.err;
  EXPECT_EQ(plan(tp + " --world_size 1 --set tensor_parallel.autotp_size=1").code, 0);  // --set moves the layout too
}

// tensor_parallel.autotp_size: the grid the run forms (world = tp × data parallel, model fastest) and the
// parameters one rank holds (tiny: 842,496 in all, of which wpe, the LayerNorms and the row-parallel biases, 19,712,
// are whole on every rank: 19,712 + 822,784 / 2).
TEST(PlanCli, TensorParallelShowsTheGridAndTheSlicesPerRank) {
  const std::string path = write_config("tp.json", {{"train_micro_batch_size_per_gpu", 2},
                                                     {"zero_optimization", {{"stage", 1}}},
                                                     {"tensor_parallel", {{"autotp_size", 2}}}});
  const PlanRun r = plan(path + " --model tiny --world_size 4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("grid: 4 ranks = pipeline 1 x data parallel 2 x tensor parallel 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 2: pipe 0, data 1, model 0\nrank 3: pipe 0, data 1, model 1\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("tensor parallel 2: 431104 params per rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model-state memory per rank (Adam, 431104 params"), std::string::npos) << r.out;
}

// ZeRO++ on gpt-train's tiny model (842,496 params) over 4 ranks in bf16: a rank receives 3/4 of the weights per
// gather, int8 under qwZ (plus a 4-byte scale per 4,096), once over the data group and once inside its hpZ pair.
TEST(PlanCli, ZeroPlusPlusShowsTheGatherBytesAndTheSecondaryShards) {
  const std::string path = write_config("zeropp.json", {{"train_micro_batch_size_per_gpu", 2},
                                                         {"bf16", {{"enabled", true}}},
                                                         {"zero_optimization", {{"stage", 3},
                                                                                {"zero_quantized_weights", true},
                                                                                {"zero_hpz_partition_size", 2},
                                                                                {"zero_quantized_gradients", true}}}});
  const PlanRun r = plan(path + " --model tiny --world_size 4");
  ASSERT_EQ(r.code, 0) << r.err;
  // 631,872 × (1 + 4 / 4,096) B over the data group; plain ZeRO-3: 2 gathers × 631,872 × 2 B.
  EXPECT_NE(r.out.find("weight all-gathers over the data-parallel group: 617.67 KB received (plain ZeRO-3: 2.41 MB)"
                       "; qwZ: int8 blocks"),
            std::string::npos) << r.out;
  // 842,496 / 2 × 2 B each way.
  EXPECT_NE(r.out.find("hpZ 2: backward all-gathers inside groups of 2 ranks: 822.75 KB received; secondary shards "
                       "822.75 KB more memory per rank"),
            std::string::npos) << r.out;
  // qgZ in two levels: 842,496 × (½ + 4 / 1,024) B × ½ inside the pair, then half of that × ½ across the two pairs.
  EXPECT_NE(r.out.find("qgZ: gradient reduce-scatter as 4-bit all-to-alls: 207.29 KB sent inside hpZ groups + "
                       "103.65 KB across them (plain ZeRO-3: 1.21 MB)"),
            std::string::npos) << r.out;
  const std::string plain = write_config("zero3.json", {{"train_micro_batch_size_per_gpu", 2},
                                                        {"zero_optimization", {{"stage", 3}}}});
  EXPECT_EQ(plan(plain + " --model tiny --world_size 4").out.find("ZeRO++"), std::string::npos);
}

// gpt-train's MoE blocks (small: blocks 1, 3, 5 with 8 experts of 525,568 parameters each, a gate of 8 × 256 in place
// of the MLP): 15,913,216 parameters, 12,613,632 of them experts; ep 2 over 4 ranks holds half of the experts.
TEST(PlanCli, MoEShowsTheExpertsEachRankHoldsAndTheGroups) {
  const std::string path = write_config("moe.json", {{"train_micro_batch_size_per_gpu", 2},
                                                      {"zero_optimization", {{"stage", 1}}}});
  const PlanRun r = plan(path + " --model small --moe_experts 8 --ep_size 2 --world_size 4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("model: gpt-train --model small: 15913216 params"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("moe: 8 experts in each of 3 MoE blocks (1, 3, …), 4 per rank"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("expert-parallel groups [0,1], [2,3], expert-data-parallel groups [0,2], [1,3]"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("per rank: 9606400 params, of which 6306816 are experts (12613632 in all)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("model-state memory per rank (Adam, 9606400 params"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("refused with expert parallelism (ep_size 2)"), std::string::npos) << r.out;
  const PlanRun odd = plan(path + " --model small --moe_experts 8 --ep_size 3 --world_size 3");
  EXPECT_NE(odd.err.find("--moe_experts 8 is not divisible by --ep_size 3"), std::string::npos) << odd.err;
  const PlanRun wide = plan(path + " --model small --moe_experts 8 --ep_size 4 --world_size 2");
  EXPECT_NE(wide.err.find("MoE ep_size 4 must divide the data-parallel size 2"), std::string::npos) << wide.err;
}

// pipeline.stages: the grid (pipe slowest), the bubble of 1F1B over the config's micro-batches, the stages as
// PipelineEngine partitions tiny's layers by parameters (embedding 49,152 + two blocks of 198,272 | two blocks + the
// head with its copy of the tied embedding, 33,024), and the memory table for the larger stage.
TEST(PlanCli, PipelineShowsTheGridTheBubbleAndTheStages) {
  const std::string path = write_config("pp.json", {{"train_micro_batch_size_per_gpu", 2},
                                                     {"gradient_accumulation_steps", 4},
                                                     {"zero_optimization", {{"stage", 1}}},
                                                     {"pipeline", {{"stages", 2}}}});
  const PlanRun r = plan(path + " --model tiny --world_size 4");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("grid: 4 ranks = pipeline 2 x data parallel 2 x tensor parallel 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1: pipe 0, data 1, model 0\nrank 2: pipe 1, data 0, model 0\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("pipeline: 2 stages, 4 micro-batches per step (1F1B): bubble (p - 1) / (m + p - 1) = 0.2;"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("stage 0: layers 0-2, 445696 params per rank\nstage 1: layers 3-5, 429568 params per rank"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("model-state memory per rank (Adam, 445696 params"), std::string::npos) << r.out;
  const std::string uniform = write_config("pp3.json", {{"train_micro_batch_size_per_gpu", 2},
                                                         {"pipeline", {{"stages", 7}}}});
  EXPECT_NE(plan(uniform + " --model tiny --world_size 7").err.find("pipeline: 7 stages but the model has 6 layers"),
            std::string::npos);
}

TEST(PlanCli, Fp16AndBf16Rejected) {
  std::string path = write_config("both.json", {{"train_batch_size", 8}, {"fp16", {{"enabled", true}}},
                                                {"bf16", {{"enabled", true}}}});
  expect_error(plan(path), path, "fp16.enabled = true and bf16.enabled = true");
}

TEST(PlanCli, InconsistentTriangleRejected) {
  std::string path = write_config("batch.json", {{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", 4},
                                                 {"gradient_accumulation_steps", 2}});
  expect_error(plan(path + " --world_size 2"), path,
               "train_batch_size=32, train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2, world_size=2");
}

// plan fills "auto" as gpt-train does: a flag, else gpt-train's default (lr 1e-3); what nothing fills is an error.
TEST(PlanCli, AutoIsFilledAsGptTrainFillsIt) {
  std::string path = write_config("auto.json", {{"train_batch_size", 8},
                                                {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}}}}}});
  const PlanRun defaulted = plan(path);
  ASSERT_EQ(defaulted.code, 0) << defaulted.err;
  EXPECT_NE(defaulted.out.find("\"lr\": 0.001"), std::string::npos) << defaulted.out;
  const PlanRun flagged = plan(path + " --lr 1e-4");
  ASSERT_EQ(flagged.code, 0) << flagged.err;
  EXPECT_NE(flagged.out.find("\"lr\": 0.0001"), std::string::npos) << flagged.out;
  std::string unfilled = write_config("unfilled.json", {{"train_batch_size", 8},
                                                        {"zero_optimization", {{"stage3_max_live_parameters", "auto"}}}});
  expect_error(plan(unfilled), unfilled, "zero_optimization.stage3_max_live_parameters = \"auto\"");
}

std::vector<std::vector<double>> read_csv(const std::string& path, std::string* header) {
  std::ifstream in(path);
  std::getline(in, *header);
  std::vector<std::vector<double>> rows;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<double> row;
    std::stringstream fields(line);
    std::string field;
    while (std::getline(fields, field, ',')) row.push_back(std::stod(field));
    rows.push_back(row);
  }
  return rows;
}

TEST(PlanCli, ScheduleCsvRows) {
  nlohmann::json config = {
      {"train_batch_size", 8},
      {"fp16", {{"enabled", true}, {"initial_scale_power", 8}}},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
      {"scheduler",
       {{"type", "WarmupLR"},
        {"params", {{"warmup_min_lr", 0}, {"warmup_max_lr", 1e-3}, {"warmup_num_steps", 10},
                    {"warmup_type", "linear"}}}}}};
  std::string path = write_config("sched.json", config);
  std::string csv = (temp_dir() / "sched.csv").string();
  PlanRun r = plan(path + " --schedule_csv " + csv + " --steps 15");
  ASSERT_EQ(r.code, 0) << r.err;
  std::string header;
  auto rows = read_csv(csv, &header);
  EXPECT_EQ(header, "step,lr,loss_scale");
  ASSERT_EQ(rows.size(), 15u);
  for (int k = 1; k <= 15; ++k) {
    // Step k runs at iteration k - 2 (the first at the value set when built, warmup_min_lr): linear warmup over
    // 10 iterations, then flat.
    const double expected = 1e-3 * std::min(std::max(k - 2, 0), 10) / 10.0;
    EXPECT_EQ(rows[k - 1][0], k);
    EXPECT_NEAR(rows[k - 1][1], expected, 1e-12) << "step " << k;
    EXPECT_EQ(rows[k - 1][2], 256.0);
  }
  // Static scale, and 1 for bf16.
  ASSERT_EQ(plan(path + " --set fp16.loss_scale=128 --schedule_csv " + csv + " --steps 2").code, 0);
  EXPECT_EQ(read_csv(csv, &header)[1][2], 128.0);
  ASSERT_EQ(plan(path + " --set fp16.enabled=false --set bf16.enabled=true --schedule_csv " + csv + " --steps 2").code,
            0);
  EXPECT_EQ(read_csv(csv, &header)[1][2], 1.0);
}

TEST(PlanCli, ParamsTableAndBadParams) {
  std::string path = write_config("mem.json", {{"train_batch_size", 8}, {"bf16", {{"enabled", true}}},
                                               {"zero_optimization", {{"stage", 2}}}});
  PlanRun r = plan(path + " --world_size 4 --params 1.5B");
  ASSERT_EQ(r.code, 0) << r.err;
  // Stage 2, 1.5e9 params, N = 4: 2Ψ + 14Ψ/4 = 8.25e9 bytes = 7.68 GiB, printed in DeepSpeed's names (format_bytes).
  EXPECT_NE(r.out.find("7.68 GB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 *"), std::string::npos) << r.out;
  PlanRun bad = plan(path + " --params lots");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("'lots' is not a count"), std::string::npos) << bad.err;
}

}  // namespace
