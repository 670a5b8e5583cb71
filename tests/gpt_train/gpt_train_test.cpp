// gpt-train end to end: trains `tiny` for real and reads its --metrics file.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>

#include <cmath>
#include <sstream>

#include "../common/subprocess.h"

namespace dscpp::testing {
namespace {

std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> rows;
  std::istringstream in(read_text(path));
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

CommandResult gpt_train(const std::string& args) {
  return run_command(std::string(DSCPP_BINARY_DIR "/gpt-train --no_progress ") + args);
}

TEST(GptTrain, TinyTrainsAndWritesOneMetricsLinePerStep) {
  const auto dir = temp_dir("gpt_train");
  const auto metrics = dir / "run.jsonl";
  auto r = gpt_train("--model tiny --steps 40 --seq_len 64 --lr 3e-3 --warmup_steps 5 --metrics " + metrics.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = read_jsonl(metrics);
  ASSERT_EQ(rows.size(), 40u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["step"].get<int>(), static_cast<int>(i) + 1);
    for (const char* key : {"loss", "lr", "loss_scale", "grad_norm", "skipped", "step_ms", "tokens_per_s"}) {
      EXPECT_TRUE(rows[i].contains(key)) << key;
    }
  }
  const double first = rows.front()["loss"].get<double>(), last = rows.back()["loss"].get<double>();
  EXPECT_NEAR(first, std::log(256.0), 0.3) << "a fresh byte-level model starts near ln(256)";
  EXPECT_LT(last, first - 1.5) << "first " << first << " last " << last;
  EXPECT_NE(r.err.find("step 40 | loss"), std::string::npos) << "rank-0 log every steps_per_print:\n" << r.err;
}

TEST(GptTrain, AccumulationSplitGivesTheSameTrajectory) {
  const auto dir = temp_dir("gpt_train_gas");
  const std::string common = "--model tiny --steps 5 --warmup_steps 2 --seq_len 32 --data_order shuffled --metrics ";
  auto a = gpt_train(common + (dir / "a.jsonl").string() + " --micro_batch 8 --grad_accum 1");
  auto b = gpt_train(common + (dir / "b.jsonl").string() + " --micro_batch 2 --grad_accum 4");
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  const auto ra = read_jsonl(dir / "a.jsonl"), rb = read_jsonl(dir / "b.jsonl");
  ASSERT_EQ(ra.size(), rb.size());
  for (size_t i = 0; i < ra.size(); ++i) {
    const double la = ra[i]["loss"].get<double>(), lb = rb[i]["loss"].get<double>();
    EXPECT_NEAR(la, lb, 1e-5 * la) << "step " << i + 1;
  }
}

TEST(GptTrain, Bf16RunsAndLearns) {
  const auto dir = temp_dir("gpt_train_bf16");
  auto r = gpt_train("--model tiny --steps 20 --seq_len 32 --lr 3e-3 --warmup_steps 5 --bf16 --metrics " +
                     (dir / "run.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto rows = read_jsonl(dir / "run.jsonl");
  ASSERT_EQ(rows.size(), 20u);
  EXPECT_LT(rows.back()["loss"].get<double>(), rows.front()["loss"].get<double>() - 1.0);
}

TEST(GptTrain, BadConfigIsAClearErrorNamingTheKey) {
  const auto dir = temp_dir("gpt_train_bad");
  const auto config = dir / "bad.json";
  std::ofstream(config) << R"({"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": true}, "bf16": {"enabled": true}})";
  auto r = gpt_train("--model tiny --steps 1 --deepspeed_config " + config.string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("bf16"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fp16"), std::string::npos) << r.err;
}

// Every config from the source documents trains as a user would run it, its "auto"s filled by the HF-style flags:
// one without an "optimizer" (an HF Trainer user's) gets the AdamW the HF Trainer would build from --lr. The fp16 ones
// may start DeepSpeed's dynamic loss scale as high as 2^32 (initial_scale_power 32), so, as under DeepSpeed, their
// first steps overflow and are skipped while the scale halves; they get enough steps to train past that.
TEST(GptTrain, EverySharedConfigTrains) {
  const std::filesystem::path configs = DSCPP_CONFIGS_DIR;
  const auto dir = temp_dir("gpt_train_shared");
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(configs)) {
    if (entry.path().extension() != ".json") continue;
    ++count;
    SCOPED_TRACE(entry.path().filename().string());
    const std::string text = read_text(entry.path());
    const auto config = nlohmann::json::parse(text);
    const bool fp16 = config.contains("fp16") && config["fp16"].value("enabled", nlohmann::json(false)) == true;
    const size_t steps = fp16 ? 40 : 6;
    const auto metrics = dir / (entry.path().stem().string() + ".jsonl");
    auto r = gpt_train("--model tiny --n_layer 2 --steps " + std::to_string(steps) + " --seq_len 32 --micro_batch 2 "
                       "--grad_accum 2 --lr 3e-3 --warmup_steps 2 --deepspeed_config " + entry.path().string() +
                       " --metrics " + metrics.string());
    ASSERT_EQ(r.code, 0) << r.err;
    const auto rows = read_jsonl(metrics);
    ASSERT_EQ(rows.size(), steps);
    EXPECT_LT(rows.back()["loss"].get<double>(), rows.front()["loss"].get<double>()) << r.err;
    if (fp16) {  // DeepSpeed's dynamic scaler from the config's initial scale (halved at most once by the 1st step)
      const double initial = std::ldexp(1.0, config["fp16"].value("initial_scale_power", 16));
      const double first = rows.front()["loss_scale"].get<double>();
      EXPECT_TRUE(first == initial || first == initial / 2) << first << " vs " << initial << "\n" << r.err;
    }
    if (text.find("\"optimizer\"") == std::string::npos) {
      EXPECT_NE(r.err.find("no \"optimizer\" section: training with AdamW(lr 0.003"), std::string::npos) << r.err;
    }
  }
  EXPECT_GE(count, 6);
}

// --device: cuda on a machine without a GPU (or with this CPU-only LibTorch) stops before anything is built, saying
// why; an unknown device is refused by the flag's check, naming the choices.
TEST(GptTrain, DeviceFlagRefusesWhatThisMachineCannotDo) {
  auto bogus = gpt_train("--model tiny --steps 1 --device gpu");
  EXPECT_NE(bogus.code, 0);
  EXPECT_NE(bogus.err.find("--device"), std::string::npos) << bogus.err;
  EXPECT_NE(bogus.err.find("cuda"), std::string::npos) << bogus.err;
  if (torch::cuda::device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  auto cuda = gpt_train("--model tiny --steps 1 --device cuda");
  EXPECT_NE(cuda.code, 0);
  EXPECT_NE(cuda.err.find("device cuda"), std::string::npos) << cuda.err;
  EXPECT_EQ(cuda.err.find("Exception raised from"), std::string::npos) << cuda.err;  // our message, no backtrace
}

// --device cpu trains exactly as the default does here (auto is the CPU without a GPU).
TEST(GptTrain, DeviceCpuIsTheDefaultWithoutAGpu) {
  if (torch::cuda::device_count() > 0) GTEST_SKIP() << "auto picks the GPU here";
  const auto dir = temp_dir("gpt_train_device");
  ASSERT_EQ(gpt_train("--model tiny --steps 3 --seq_len 16 --metrics " + (dir / "auto.jsonl").string()).code, 0);
  ASSERT_EQ(gpt_train("--model tiny --steps 3 --seq_len 16 --device cpu --metrics " + (dir / "cpu.jsonl").string()).code,
            0);
  const auto a = read_jsonl(dir / "auto.jsonl"), c = read_jsonl(dir / "cpu.jsonl");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(c.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i]["loss"].get<double>(), c[i]["loss"].get<double>()) << i;
}

}  // namespace
}  // namespace dscpp::testing
