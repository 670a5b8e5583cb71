// gpt-train --generate: a trained checkpoint continues a prompt — the same tokens on one process, on 2 ranks under
// ZeRO-3 (each block gathered inside the engine's forward) and sliced over 2 tensor-parallel ranks, greedy and
// sampled with a seed; layouts it cannot run refused before training.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "../common/multiprocess.h"

namespace dscpp::testing {
namespace {

const std::string kGptTrain = std::string(DSCPP_BINARY_DIR) + "/gpt-train --no_progress --model tiny --seq_len 32 ";

// A ZeRO `stage` config for global batch 8 at any world size up to 2 (micro-batch 4, accumulation as the world
// leaves it), written under `dir`.
std::string stage_config(const std::filesystem::path& dir, int stage) {
  const auto path = dir / ("stage" + std::to_string(stage) + ".json");
  std::ofstream(path) << nlohmann::json{{"train_batch_size", 8},
                                        {"train_micro_batch_size_per_gpu", 4},
                                        {"zero_optimization", {{"stage", stage}}},
                                        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}}}}}}
                             .dump();
  return path.string();
}

// gpt-train on `world` ranks with `flags`; rank 0's JSON line ({"prompt", "tokens", "text"}).
nlohmann::json generated(int world, const std::string& flags) {
  const auto ranks = run_ranks(world, kGptTrain + flags, "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=60");
  for (int r = 0; r < world; ++r) EXPECT_EQ(ranks[r].code, 0) << "rank " << r << ":\n" << ranks[r].err;
  try {
    return nlohmann::json::parse(ranks[0].out);
  } catch (const nlohmann::json::exception&) {
    ADD_FAILURE() << "no JSON line on rank 0's stdout:\n" << ranks[0].out << "\n" << ranks[0].err;
    return {};
  }
}

TEST(GptTrainGenerate, EveryLayoutContinuesThePromptAsOneProcessDoes) {
  const auto dir = temp_dir("gpt_generate");
  const auto trained = (dir / "trained").string();
  const auto zero0 = stage_config(dir, 0), zero3 = stage_config(dir, 3);
  // 40 steps on one process, saved; then each layout loads it (at its last step: no more training) and generates.
  const auto first = generated(1, "--steps 40 --deepspeed_config " + zero0 + " --save_dir " + trained +
                                       " --generate Licensee --max_new_tokens 24");
  ASSERT_EQ(first["tokens"].size(), 24u) << first;
  EXPECT_EQ(first["prompt"], "Licensee");
  const std::string load = "--steps 40 --load_dir " + trained + " --generate Licensee --max_new_tokens 24 ";
  EXPECT_EQ(generated(1, load + "--deepspeed_config " + zero0)["tokens"], first["tokens"]);
  EXPECT_EQ(generated(2, load + "--deepspeed_config " + zero3)["tokens"], first["tokens"]) << "ZeRO-3, 2 ranks";
  EXPECT_EQ(generated(2, load + "--deepspeed_config " + zero0 + " --tensor_parallel 2")["tokens"], first["tokens"])
      << "tensor parallel 2";
  // Sampled from its own seeded generator: every rank draws the same, so every layout does.
  const std::string sample = "--temperature 0.8 --top_k 20 --top_p 0.9 --seed 7 ";
  const auto one = generated(1, load + sample + "--deepspeed_config " + zero0);
  ASSERT_EQ(one["tokens"].size(), 24u) << one;
  EXPECT_NE(one["tokens"], first["tokens"]);
  EXPECT_EQ(generated(2, load + sample + "--deepspeed_config " + zero3)["tokens"], one["tokens"]) << "ZeRO-3";
}

TEST(GptTrainGenerate, LayoutsItCannotRunAreRefusedBeforeTraining) {
  const auto ranks = run_ranks(2, kGptTrain + "--steps 2 --pipeline_parallel 2 --generate x",
                               "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=5");
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].code, 1);
    EXPECT_NE(ranks[r].err.find("--generate with --pipeline_parallel, --sequence_parallel or sparse attention is not "
                                "supported yet"),
              std::string::npos)
        << ranks[r].err;
    EXPECT_EQ(ranks[r].err.find("step 1"), std::string::npos) << "it trained first:\n" << ranks[r].err;
  }
  // What generation itself would refuse is refused before training too.
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--top_p 0", "top_p must be in (0, 1]"}, {"--max_new_tokens 5000", "more than block_size"}}) {
    const auto one = run_ranks(1, kGptTrain + "--steps 2 --generate x " + flags, "OMP_NUM_THREADS=1");
    EXPECT_EQ(one[0].code, 1) << flags;
    EXPECT_NE(one[0].err.find(message), std::string::npos) << flags << ":\n" << one[0].err;
    EXPECT_EQ(one[0].err.find("step 1"), std::string::npos) << flags << ": it trained first";
  }
}

}  // namespace
}  // namespace dscpp::testing
