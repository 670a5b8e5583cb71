// ZeRO-3 behaviours gpt-train cannot show: a block skipped on some steps (the recorded gather order changes, so
// prefetch must re-trace), and ranks that diverge (a rank-dependent branch, a rank with fewer micro-batches), which
// must stop every rank with an error naming where each was — never a hang or silently wrong parameters.
// This binary spawns itself with --worker as each rank (the engine joins from the torchrun-style env).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <sstream>

#include "../common/multiprocess.h"
#include "../common/seeded_rows.h"
#include "../common/test_device.h"
#include "dscpp/engine/engine.h"

namespace dscpp::testing {
namespace {

constexpr int kWidth = 32;
constexpr int kBlocks = 4;
constexpr int kGlobalBatch = 8;
constexpr int kSteps = 12;

// in → 4 × (Linear + tanh) blocks → out; block 1 runs only on steps where `skip` says so.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    in = register_module("in", torch::nn::Linear(kWidth, kWidth));
    for (int i = 0; i < kBlocks; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i),
                                       torch::nn::Sequential(torch::nn::Linear(kWidth, kWidth), torch::nn::Tanh())));
    }
    out = register_module("out", torch::nn::Linear(kWidth, 1));
    to(test_device());
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  std::vector<torch::nn::Sequential> blocks;
};
TORCH_MODULE(Net);

// Rows [first, first + count) of the global batch (the same batch every step, so the loss must fall).
std::pair<torch::Tensor, torch::Tensor> rows(int64_t first, int64_t count) { return seeded_rows(first, count, kWidth); }

// Scenarios: "train" (block 1 skipped on every third step; prints each step's loss), "diverge" (rank 1 skips
// block 1 on step 2 while rank 0 runs it), "fewer" (rank 1 skips its second micro-batch of step 2).
int run_worker(const std::string& scenario, int stage, int grad_accum) {
  const auto env = DistEnv::from_env();
  const nlohmann::json json = {
      {"train_batch_size", kGlobalBatch},
      {"gradient_accumulation_steps", grad_accum},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}},
      {"zero_optimization",
       {{"stage", stage}, {"stage3_param_persistence_threshold", 0}, {"stage3_max_reuse_distance", 0}}}};
  ConfigOptions options;
  options.world_size = env.world_size;
  const auto config = Config::from_string(json.dump(), options);
  torch::manual_seed(1);
  Net net;
  InitOptions init;
  for (const auto& block : net->blocks) init.gather_units.push_back(block.ptr());
  auto engine = initialize(net.ptr(), config, init);
  const int64_t micro = kGlobalBatch / (grad_accum * env.world_size);
  for (int64_t step = 0; step < kSteps; ++step) {
    for (int m = 0; m < grad_accum; ++m) {
      if (scenario == "fewer" && env.rank == 1 && step == 2 && m == 1) {
        engine->step();
        continue;
      }
      bool skip = step % 3 == 1;
      if (scenario == "diverge" && step == 2) skip = env.rank == 1;
      auto [x, y] = rows((m * env.world_size + env.rank) * micro, micro);
      auto loss = engine->forward([&, skip = skip] {
        auto h = torch::tanh(net->in->forward(x.to(test_device())));
        for (int i = 0; i < kBlocks; ++i) {
          if (i == 1 && skip) continue;
          h = engine->run_unit(*net->blocks[i], [&] { return net->blocks[i]->forward(h); });
        }
        return torch::mse_loss(net->out->forward(h), y.to(test_device()));
      });
      engine->backward(loss);
      engine->step();
    }
    if (env.rank == 0) std::cout << engine->last_step().loss << std::endl;
  }
  return 0;
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> values;
  std::istringstream in(out);
  for (double v; in >> v;) values.push_back(v);
  return values;
}

std::vector<CommandResult> run(const std::string& scenario, int world, int stage, int grad_accum) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  return run_ranks(world,
                   self + " --worker " + scenario + " " + std::to_string(stage) + " " +
                       std::to_string(grad_accum),
                   "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=60");
}

class Zero3Conditional : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(Zero3Conditional, SkippedBlockTrainsLikeStage0OnOneProcess) {
  const auto [world, grad_accum] = GetParam();
  const auto reference = run("train", 1, 0, grad_accum);
  ASSERT_EQ(reference[0].code, 0) << reference[0].err;
  const auto ranks = run("train", world, 3, grad_accum);
  for (int r = 0; r < world; ++r) ASSERT_EQ(ranks[r].code, 0) << "rank " << r << ":\n" << ranks[r].err;
  const auto want = losses(reference[0].out), got = losses(ranks[0].out);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - want[i]), 1e-5 * std::abs(want[i])) << "step " << i + 1;
  }
  // Steps 1 and 12 both run every block: the same function of the same batch, trained.
  EXPECT_LT(got.back(), 0.8 * got.front());
}

INSTANTIATE_TEST_SUITE_P(Worlds, Zero3Conditional,
                         ::testing::Values(std::make_pair(1, 1), std::make_pair(2, 1), std::make_pair(2, 2),
                                           std::make_pair(4, 1)),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.first) + "_gas" +
                                  std::to_string(info.param.second);
                         });

void expect_disagreement(const std::vector<CommandResult>& ranks, const std::string& rank1_at) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_NE(ranks[r].code, 0) << "rank " << r;
    EXPECT_NE(ranks[r].err.find("ZeRO-3: ranks disagree on the next collective"), std::string::npos)
        << "rank " << r << ":\n" << ranks[r].err;
    EXPECT_NE(ranks[r].err.find("rank 1: " + rank1_at), std::string::npos) << "rank " << r << ":\n" << ranks[r].err;
  }
}

TEST(Zero3Divergence, RankDependentBranchStopsEveryRankWithWhereEachWas) {
  // Step 2 (micro-step 2): after the root (#0) and block0 (#1), rank 0 demands block1 and rank 1 block2.
  expect_disagreement(run("diverge", 2, 3, 1), "demand #2 of micro-step 2 (block2)");
}

TEST(Zero3Divergence, RankWithFewerMicroBatchesStopsEveryRank) {
  // Step 2's second micro-batch: rank 0 gathers the root while rank 1 has gone on to the boundary.
  expect_disagreement(run("fewer", 2, 3, 2), "the accumulation boundary after micro-step 5");
}

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) {
  if (argc >= 5 && std::strcmp(argv[1], "--worker") == 0) {
    try {
      return dscpp::testing::run_worker(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
    } catch (const std::exception& e) {
      std::cerr << "worker " << argv[2] << " failed: " << e.what() << std::endl;
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
