// Pipeline parallelism over real processes. gpt-train --pipeline_parallel (the tiny GPT, its embedding and head tied
// across the first and last stage) gives stage 0's per-step losses on one process over the same global batch, alone
// and combined with data parallelism (ZeRO-1) and tensor parallelism; every stage holds exactly its layers' parameters
// (the tied embedding once more); a stage that dies mid-pipeline ends its peers with an error naming it; the rules
// (ZeRO-2/3, more stages than layers, a grid that does not divide the world) are errors naming the numbers. The
// binary spawns itself with --worker as each rank for the engine-level cases.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "../common/gpt_train_runs.h"
#include "../common/multiprocess.h"
#include "dscpp/dscpp.h"
#include "data/batch_sampler.h"
#include "data/token_dataset.h"
#include "dscpp/activation/rng_state.h"
#include "gpt_pipeline.h"
#include "model/gpt.h"

namespace dscpp::testing {
namespace {

constexpr int64_t kGlobalBatch = 8, kSeq = 16;

// The tiny GPT on `pipe` stages × the rest data parallel, global batch 8 in `micro` micro-batches per rank.
struct Setup {
  ParallelGroups groups;
  Config config;
  gpt::Gpt model{nullptr};
};

// One world comm per process: every grid splits it (a second init_comm would race the first store's teardown).
std::shared_ptr<Comm> world_comm() {
  static const auto world = init_comm(DistEnv::from_env(), CommBackend::kGloo);
  return world;
}

Setup setup(int pipe, int micro, int zero_stage, const std::string& partition = "parameters", int64_t n_layer = 4) {
  auto world = world_comm();
  ProcessTopology topology(world->world_size(), pipe, 1);
  Setup s{make_parallel_groups(world, topology), Config(), nullptr};
  const int dp = topology.data();
  ConfigOptions options;
  options.world_size = dp;
  s.config = Config::from_json({{"train_batch_size", kGlobalBatch},
                                {"gradient_accumulation_steps", micro},
                                {"zero_optimization", {{"stage", zero_stage}}},
                                {"pipeline", {{"stages", pipe}, {"partition", partition}}},
                                {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}},
                               options);
  auto c = gpt::GptConfig::preset("tiny", 64);
  c.n_layer = n_layer;
  torch::manual_seed(5);
  s.model = gpt::Gpt(c);
  return s;
}

int64_t numel_of(const std::vector<torch::Tensor>& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

// pipe 4 (uniform: one layer a stage) and then pipe 2 × data 2: each stage holds its layers' parameters, and the
// pipeline's stages together hold the model plus one more copy of the tied embedding.
int counts() {
  for (const auto& [pipe, partition] : std::vector<std::pair<int, std::string>>{{4, "uniform"}, {2, "parameters"}}) {
    auto s = setup(pipe, 2, 0, partition, /*n_layer=*/2);
    const int64_t whole = numel_of(s.model->parameters()), wte = s.model->wte->weight.numel();
    PipelineEngine pipeline(gpt::pipeline_model(s.model), s.config, s.groups);
    auto mine = torch::tensor({numel_of(pipeline.module()->parameters())}, torch::kLong);
    auto sum = mine.clone();
    s.groups.pipe->all_reduce(sum).wait();
    const std::string where = "pipe " + std::to_string(pipe) + ", stage " + std::to_string(pipeline.stage());
    if (sum.item<int64_t>() != whole + wte) {
      throw std::runtime_error(where + ": stages hold " + std::to_string(sum.item<int64_t>()) +
                               " parameters, the model " + std::to_string(whole) + " + the tied copy " +
                               std::to_string(wte));
    }
    int64_t expected = 0;
    if (pipe == 4) {
      const auto& m = s.model;
      const std::vector<int64_t> per_stage = {
          m->wte->weight.numel() + m->wpe->weight.numel(), numel_of(m->blocks()[0]->parameters()),
          numel_of(m->blocks()[1]->parameters()), numel_of(m->ln_f->parameters()) + m->wte->weight.numel()};
      expected = per_stage[pipeline.stage()];
      if (mine.item<int64_t>() != expected) {
        throw std::runtime_error(where + " holds " + std::to_string(mine.item<int64_t>()) + " parameters, its layer " +
                                 std::to_string(expected));
      }
    }
    if (pipeline.ties().size() != 1 || pipeline.ties()[0].first != "wte") {
      throw std::runtime_error(where + ": the tie should be wte alone");
    }
  }
  world_comm()->barrier();  // rank 0 hosts the store: nobody leaves before every rank is done with it
  std::cout << "counts ok\n";
  return 0;
}

// The last stage dies while the first waits for its gradient: the first ends with a CommError naming the peer.
int dies() {
  auto s = setup(2, 2, 0);
  PipelineEngine pipeline(gpt::pipeline_model(s.model), s.config, s.groups);
  const auto data = torch::randint(0, 64, {kGlobalBatch / 2, kSeq + 1}, torch::kLong);
  auto batch = [&](int micro) {
    if (pipeline.is_last_stage() && pipeline.engine().global_steps() == 1 && micro == 1) std::_Exit(3);
    return MicroBatch{data.narrow(1, 0, kSeq), data.narrow(1, 1, kSeq)};
  };
  pipeline.train_batch(batch);
  try {
    pipeline.train_batch(batch);
  } catch (const CommError& e) {
    std::cerr << "CommError: " << e.what() << std::endl;
    return 4;
  }
  return 0;
}

// One layer on two stages.
int too_many_stages() {
  auto s = setup(2, 2, 0, "parameters");
  auto whole = gpt::pipeline_model(s.model);
  PipelineModel one{{whole.layers[1]}, whole.loss_fn};
  try {
    PipelineEngine pipeline(one, s.config, s.groups);
  } catch (const std::invalid_argument& e) {
    std::cerr << e.what() << std::endl;
    world_comm()->barrier();  // rank 0 hosts the store: it stays until both ranks have failed the same way
    return 5;
  }
  return 0;
}

// gpt-train --pipeline_parallel 2 --dropout 0.1's run in one process, by the documented rule: the tiny GPT as
// gpt-train builds it (seed 1234, the embedded corpus, seq 32), stage 0's layers (embed, h.0, h.1, as the pipeline
// partitions tiny by parameters) drawing from a generator seeded 1234 and stage 1's (h.2, h.3, head) from one seeded
// 1234 + 100, each picking up where it left off; 20 steps at global batch 8 in 2 micro-batches, clipping at 1.0.
// Writes each step's loss, one a line, to `out`.
int dropout_reference(const std::string& out) {
  auto dataset = std::make_shared<const gpt::TokenDataset>(gpt::TokenDataset::default_corpus());
  auto c = gpt::GptConfig::preset("tiny", dataset->vocab_size());
  c.dropout = 0.1;
  torch::manual_seed(1234);
  gpt::Gpt model(c);
  const auto pipe = gpt::pipeline_model(model);
  constexpr size_t kSecondStage = 3;  // layers 0-2 | 3-5, as PipelineEngine partitions tiny over 2 stages
  torch::manual_seed(1234);
  std::vector<RngState> stage_rng{RngState::capture(torch::kCPU)};
  torch::manual_seed(1234 + 100);
  stage_rng.push_back(RngState::capture(torch::kCPU));
  ConfigOptions options;
  options.world_size = 1;
  const auto config = Config::from_json({{"train_batch_size", 8}, {"gradient_accumulation_steps", 2},
                                         {"gradient_clipping", 1.0},
                                         {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}},
                                        options);
  InitOptions init;
  init.comm = make_single_process_comm();
  auto engine = initialize(model.ptr(), config, init);
  gpt::BatchSamplerOptions sampling;
  sampling.seq_len = 32;
  sampling.order = gpt::DataOrder::kSequential;  // gpt-train's default
  sampling.seed = 1234;
  const gpt::BatchSampler sampler(dataset, sampling);
  std::ofstream losses(out);
  for (int64_t step = 0; step < 20; ++step) {
    for (int64_t micro = 0; micro < 2; ++micro) {
      const auto rows = sampler.rows(step, 8, micro * 4, 4);
      auto loss = engine->forward([&] {
        torch::Tensor x = rows.inputs;
        stage_rng[0].restore();
        for (size_t l = 0; l < pipe.layers.size(); ++l) {
          if (l == kSecondStage) {
            stage_rng[0] = RngState::capture(torch::kCPU);
            stage_rng[1].restore();
          }
          x = pipe.layers[l].forward(x);
        }
        stage_rng[1] = RngState::capture(torch::kCPU);
        return pipe.loss_fn(x, rows.targets);
      });
      engine->backward(loss);
      engine->step();
    }
    losses << std::setprecision(17) << engine->last_step().loss << "\n";
  }
  return 0;
}

int worker(const std::string& name, const std::string& arg) {
  if (name == "dropout_reference") return dropout_reference(arg);
  if (name == "counts") return counts();
  if (name == "dies") return dies();
  if (name == "too_many_stages") return too_many_stages();
  std::cerr << "unknown worker " << name << std::endl;
  return 2;
}

std::string self_path;  // this binary (argv[0]), which each rank runs as a worker
std::string self() { return self_path; }
const char* const kEnv = "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=1";

TEST(Pipeline, EveryStageHoldsItsLayersAndTheTiedEmbeddingTwice) {
  const auto ranks = run_ranks(4, self() + " --worker counts", kEnv);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(ranks[r].code, 0) << "rank " << r << ": " << ranks[r].err;
}

TEST(Pipeline, AStageThatDiesEndsItsPeerWithAnErrorNamingIt) {
  const auto ranks = run_ranks(2, self() + " --worker dies", kEnv);
  EXPECT_EQ(ranks[1].code, 3) << ranks[1].err;
  EXPECT_EQ(ranks[0].code, 4) << ranks[0].err;
  EXPECT_NE(ranks[0].err.find("from rank 1"), std::string::npos) << ranks[0].err;
}

TEST(Pipeline, MoreStagesThanLayersNamesBoth) {
  const auto ranks = run_ranks(2, self() + " --worker too_many_stages", kEnv);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].code, 5) << ranks[r].err;
    EXPECT_NE(ranks[r].err.find("pipeline: 2 stages but the model has 1 layers: every stage needs at least one layer"),
              std::string::npos)
        << ranks[r].err;
  }
}

// gpt-train, 20 steps of the tiny GPT at global batch 8 over `micro` micro-batches per rank, clipping at 1.0.
std::vector<nlohmann::json> gpt_train(int world, int stage, int micro, const std::string& extra) {
  return gpt_train_metrics(world,
                           {{"train_batch_size", kGlobalBatch}, {"gradient_accumulation_steps", micro},
                            {"gradient_clipping", 1.0}, {"zero_optimization", {{"stage", stage}}},
                            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}},
                           extra);
}

TEST(Pipeline, GptTrainPipelinedGivesTheOneProcessLosses) {
  const auto whole = gpt_train(1, 0, 1, "");
  ASSERT_EQ(whole.size(), 20u);
  struct Layout {
    int world, stage, micro;
    std::string flags;
  };
  for (const auto& l : std::vector<Layout>{{2, 0, 2, "--pipeline_parallel 2"},
                                           {4, 1, 2, "--pipeline_parallel 2"},
                                           {4, 0, 2, "--pipeline_parallel 2 --tensor_parallel 2"},
                                           // pipeline.activation_checkpoint_interval 1: each block recomputed.
                                           {2, 0, 2, "--pipeline_parallel 2 --activation_checkpointing"}}) {
    SCOPED_TRACE("world " + std::to_string(l.world) + ", ZeRO-" + std::to_string(l.stage) + ", " +
                 std::to_string(l.micro) + " micro-batches, " + l.flags);
    expect_same_trajectory(gpt_train(l.world, l.stage, l.micro, l.flags), whole);
  }
}

// Every depth with every micro-batch count against one process.
void sweep(const std::vector<int>& depths, const std::vector<int>& micros) {
  const auto whole = gpt_train(1, 0, 1, "");
  for (int pipe : depths) {
    for (int micro : micros) {
      SCOPED_TRACE("pipe " + std::to_string(pipe) + ", " + std::to_string(micro) + " micro-batches");
      expect_same_trajectory(gpt_train(pipe, 0, micro, "--pipeline_parallel " + std::to_string(pipe)), whole);
    }
  }
}

// The long label runs every pair (PipelineLong: tests/pipe/CMakeLists.txt); the default set the deepest pipeline over
// the most micro-batches.
TEST(PipelineLong, GptTrainPipelinedOverEveryDepthAndMicroBatchCount) { sweep({2, 4}, {1, 2, 8}); }
TEST(Pipeline, GptTrainPipelinedOverFourStagesAndEightMicroBatches) { sweep({4}, {8}); }

// 1F1B's memory bound: a stage's activation peak (CPU tensor bytes above the step's start) does not grow with the
// number of micro-batches — the activations and gradients a stage has sent are freed as soon as they are known to
// have arrived, not at the end of the batch (which added one output and one input gradient per micro-batch:
// 32 KiB each here). pp 2, micro-batch 2, m = 2 and 8: the same peak on each stage (measured equal to the KiB).
TEST(Pipeline, ActivationPeakDoesNotGrowWithMicroBatches) {
  auto peaks = [](int micro) {
    const auto ranks = run_ranks(2, std::string(DSCPP_BINARY_DIR) + "/gpt-train --no_progress --model tiny "
                                 "--seq_len 32 --steps 2 --micro_batch 2 --pipeline_parallel 2 --grad_accum " +
                                 std::to_string(micro), kEnv);
    std::vector<int64_t> out;
    for (int r = 0; r < 2; ++r) EXPECT_EQ(ranks[r].code, 0) << ranks[r].err;
    std::istringstream in(ranks[0].err);
    for (std::string line; std::getline(in, line);) {
      const auto at = line.find("activation peak ");
      if (line.find("pipeline stage") != std::string::npos && at != std::string::npos) {
        out.push_back(std::stoll(line.substr(at + 16)));
      }
    }
    return out;
  };
  const auto two = peaks(2), eight = peaks(8);
  ASSERT_EQ(two.size(), 2u);
  ASSERT_EQ(eight.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    EXPECT_GT(two[s], 0) << "stage " << s;
    EXPECT_LE(eight[s], two[s] + 16) << "stage " << s << " (KiB)";
  }
}

// Dropout pipelined follows the documented rule (stage s draws from a generator seeded --seed + 100·s): the losses
// of the one-process run that draws each stage's layers that way, within 1e-5; and dropout changes the run.
TEST(Pipeline, GptTrainPipelinedDropoutDrawsEachStageFromItsOwnSeed) {
  const auto dir = temp_dir("pp_dropout");
  const auto reference = run_command(self() + " --worker dropout_reference " + (dir / "losses").string());
  ASSERT_EQ(reference.code, 0) << reference.err;
  std::vector<double> want;
  std::istringstream in(read_text(dir / "losses"));
  for (double loss; in >> loss;) want.push_back(loss);
  ASSERT_EQ(want.size(), 20u);
  const auto got = gpt_train(2, 0, 2, "--pipeline_parallel 2 --dropout 0.1");
  const auto plain = gpt_train(2, 0, 2, "--pipeline_parallel 2");
  ASSERT_EQ(got.size(), 20u);
  ASSERT_EQ(plain.size(), 20u);
  EXPECT_GT(std::abs(got[0]["loss"].get<double>() - plain[0]["loss"].get<double>()), 1e-3) << "dropout must act";
  for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(got[k]["loss"].get<double>(), want[k], 1e-5) << "step " << k + 1;
}

// The rules a pipeline must meet, each named with its numbers.
TEST(Pipeline, GptTrainNamesWhatDoesNotPipeline) {
  const std::string gpt = std::string(DSCPP_BINARY_DIR) + "/gpt-train --no_progress --model tiny --steps 1 ";
  const auto dir = temp_dir("pp_rules");
  const auto zero2 = dir / "zero2.json";
  std::ofstream(zero2) << R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2},
                              "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--pipeline_parallel 3", "pipeline stages 3 x tensor-parallel size 1 = 3 does not divide the world size 2"},
      {"--pipeline_parallel 2 --deepspeed_config " + zero2.string(),
       "zero_optimization.stage 2 with pipeline parallelism (2 stages): as DeepSpeed's PipelineEngine, pipelining "
       "runs with ZeRO stage 0 or 1 only"},
      {"--pipeline_parallel 2 --partition type:Attention", "matches none of the layer types"},
      {"--pipeline_parallel 2 --init_from /tmp/x", "--init_from with pipeline parallelism (2 stages)"},
  };
  for (const auto& [flags, message] : cases) {
    const auto ranks = run_ranks(2, gpt + flags, kEnv);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(ranks[r].code, 1) << flags;
      EXPECT_NE(ranks[r].err.find(message), std::string::npos) << flags << ": " << ranks[r].err;
    }
  }
}

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) {
  dscpp::testing::self_path = argv[0];
  if (argc >= 3 && std::strcmp(argv[1], "--worker") == 0) {
    try {
      return dscpp::testing::worker(argv[2], argc >= 4 ? argv[3] : "");
    } catch (const std::exception& e) {
      std::cerr << "worker " << argv[2] << " failed: " << e.what() << std::endl;
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
