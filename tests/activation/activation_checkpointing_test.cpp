// Activation checkpointing: a checkpointed block gives the same outputs, gradients and later random draws as the
// block run plainly; it keeps only its input (or this rank's part of it); and gpt-train trains the same with and
// without it at every ZeRO stage, on 1 and 2 processes, with dropout on, while its activations take less memory.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../common/multiprocess.h"
#include "../common/test_device.h"
#include "dscpp/activation/checkpointing.h"
#include "dscpp/comm/comm.h"
#include "dscpp/config/config_error.h"

namespace dscpp::testing {
namespace {

// A block whose forward draws random numbers (dropout) and whose backward needs its activations.
struct DropoutBlockImpl : torch::nn::Module {
  DropoutBlockImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 16));
    to(test_device());
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return x + fc2->forward(torch::dropout(torch::gelu(fc1->forward(x)), 0.3, is_training()));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(DropoutBlock);

// Tensors on the test device, beside the blocks (DSCPP_TEST_DEVICE); its generator is the one dropout draws from.
torch::TensorOptions on_device() { return torch::TensorOptions().device(test_device()); }

struct Result {
  torch::Tensor loss, input_grad, next_draw;
  std::vector<torch::Tensor> param_grads;
};

// Three blocks in a row on x (7 × 3 × 16), each plain or checkpointed; the loss's backward; then one more draw
// from the generator, which must not depend on whether blocks were recomputed.
Result run_blocks(ActivationCheckpointing* checkpointing, const ActivationCheckpointingConfig& config = {},
                  std::shared_ptr<Comm> group = nullptr) {
  torch::manual_seed(11);
  std::vector<DropoutBlock> blocks(3);
  auto x = torch::randn({7, 3, 16}, on_device()).requires_grad_(true);
  std::unique_ptr<ActivationCheckpointing> owned;
  if (!checkpointing && (config.partition_activations || config.cpu_checkpointing ||
                         config.contiguous_memory_optimization)) {
    owned = std::make_unique<ActivationCheckpointing>(config, std::move(group));
    checkpointing = owned.get();
  }
  torch::manual_seed(12);
  if (checkpointing) checkpointing->begin_forward();
  auto h = x;
  for (auto& block : blocks) {
    auto run = [unit = block.ptr()](const torch::Tensor& in) { return unit->forward(in); };
    h = checkpointing ? checkpointing->checkpoint(run, h) : run(h);
  }
  Result r;
  r.loss = (h * h).mean();
  r.loss.backward();
  r.input_grad = x.grad().clone();
  for (auto& block : blocks) {
    for (const auto& p : block->parameters()) r.param_grads.push_back(p.grad().clone());
  }
  r.next_draw = torch::rand({4}, on_device());
  return r;
}

void expect_same(const Result& want, const Result& got) {
  EXPECT_TRUE(torch::equal(want.loss, got.loss)) << want.loss.item<double>() << " vs " << got.loss.item<double>();
  EXPECT_TRUE(torch::equal(want.input_grad, got.input_grad));
  ASSERT_EQ(want.param_grads.size(), got.param_grads.size());
  for (size_t i = 0; i < want.param_grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(want.param_grads[i], got.param_grads[i])) << "parameter " << i;
  }
  EXPECT_TRUE(torch::equal(want.next_draw, got.next_draw)) << "the generator moved on differently";
}

TEST(ActivationCheckpointing, SameLossGradientsAndLaterDrawsAsThePlainBlocksWithDropout) {
  const auto plain = run_blocks(nullptr);
  ActivationCheckpointing checkpointing({}, nullptr);
  const auto checkpointed = run_blocks(&checkpointing);
  expect_same(plain, checkpointed);
  const auto stats = checkpointing.stats();
  EXPECT_EQ(stats.checkpoints, 3);
  EXPECT_EQ(stats.recomputes, 3);
  EXPECT_EQ(stats.saved_bytes, 0) << "every kept input is released by its recompute";
  EXPECT_EQ(stats.peak_saved_bytes, 3 * 7 * 3 * 16 * 4) << "three inputs of 336 floats, nothing else";
}

TEST(ActivationCheckpointing, DropoutReallyDrawsSoTheComparisonCanFail) {
  // Two forwards of one block on one input differ: a recompute without the forward's generator state would not
  // reproduce the forward, so the equalities above are not vacuous.
  DropoutBlock block;
  auto x = torch::randn({7, 3, 16}, on_device());
  EXPECT_FALSE(torch::equal(block->forward(x), block->forward(x)));
}

TEST(ActivationCheckpointing, KeepsOnlyTheInputUntilBackward) {
  ActivationCheckpointing checkpointing({}, nullptr);
  DropoutBlock block;
  auto x = torch::randn({5, 16}, on_device()).requires_grad_(true);
  auto y = checkpointing.checkpoint([unit = block.ptr()](const torch::Tensor& in) { return unit->forward(in); }, x);
  EXPECT_TRUE(y.requires_grad());
  EXPECT_EQ(checkpointing.stats().saved_bytes, 5 * 16 * 4);
  EXPECT_EQ(checkpointing.stats().recomputes, 0);
  y.sum().backward();
  EXPECT_EQ(checkpointing.stats().saved_bytes, 0);
  EXPECT_EQ(checkpointing.stats().recomputes, 1);
  EXPECT_TRUE(block->fc1->weight.grad().defined());
}

TEST(ActivationCheckpointing, WithoutGradModeItIsAPlainCall) {
  ActivationCheckpointing checkpointing({}, nullptr);
  DropoutBlock block;
  block->eval();
  auto x = torch::randn({5, 16}, on_device());
  torch::NoGradGuard no_grad;
  auto y = checkpointing.checkpoint([unit = block.ptr()](const torch::Tensor& in) { return unit->forward(in); }, x);
  EXPECT_TRUE(torch::equal(y, block->forward(x)));
  EXPECT_EQ(checkpointing.stats().checkpoints, 0);
}

// cpu_checkpointing with contiguous_memory_optimization over `slots` checkpoints per forward.
ActivationCheckpointingConfig kept_on_cpu_in_slots(int64_t slots) {
  ActivationCheckpointingConfig config;
  config.cpu_checkpointing = true;
  config.contiguous_memory_optimization = true;
  config.number_checkpoints = slots;
  return config;
}

TEST(ActivationCheckpointing, CpuAndContiguousKeepingTrainTheSame) {
  const auto plain = run_blocks(nullptr);
  ActivationCheckpointing checkpointing(kept_on_cpu_in_slots(3), nullptr);
  expect_same(plain, run_blocks(&checkpointing));
  // Twice: the second forward reuses the slots its predecessor's backward freed.
  expect_same(plain, run_blocks(&checkpointing));
  EXPECT_EQ(checkpointing.stats().recomputes, 6);
}

TEST(ActivationCheckpointing, ContiguousErrorsNameTheKeys) {
  ActivationCheckpointingConfig config;
  config.contiguous_memory_optimization = true;
  try {
    ActivationCheckpointing checkpointing(config, nullptr);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("activation_checkpointing.number_checkpoints"), std::string::npos) << e.what();
  }
  config.number_checkpoints = 2;  // three blocks
  ActivationCheckpointing checkpointing(config, nullptr);
  try {
    run_blocks(&checkpointing);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("number_checkpoints is 2"), std::string::npos) << e.what();
  }
  config.number_checkpoints = 0;
  EXPECT_THROW(ActivationCheckpointing(config, nullptr), ConfigError);
}

// A block of three inputs (an activation, a second activation, integer indices) and three results (one computed,
// one that is an input returned as it is, the indices moved on), twice in a row; only the first two results of the
// last block reach the loss. Plain or checkpointed: the loss, both inputs' gradients, the parameters' gradients and
// the next draw are the same.
Result run_list_blocks(ActivationCheckpointing* checkpointing) {
  torch::manual_seed(21);
  std::vector<DropoutBlock> blocks(2);
  auto x = torch::randn({6, 16}, on_device()).requires_grad_(true);
  auto h = torch::randn({6, 16}, on_device()).requires_grad_(true);
  auto index = torch::randint(0, 6, {6}, on_device().dtype(torch::kLong));
  torch::manual_seed(22);
  if (checkpointing) checkpointing->begin_forward();
  std::vector<torch::Tensor> values{x, h, index};
  for (auto& block : blocks) {
    auto run = [unit = block.ptr()](const std::vector<torch::Tensor>& in) {
      auto mixed = unit->forward(in[0]).index_select(0, in[2]) * torch::tanh(in[1]);
      return std::vector<torch::Tensor>{mixed, in[1], (in[2] + 1).remainder(6)};
    };
    values = checkpointing ? checkpointing->checkpoint(ActivationCheckpointing::ListBlock(run), values) : run(values);
  }
  EXPECT_FALSE(values[2].requires_grad()) << "integer results have no gradient history";
  Result r;
  r.loss = (values[0] * values[0]).mean() + values[1].sin().sum();
  r.loss.backward();
  r.input_grad = torch::cat({x.grad(), h.grad()});
  for (auto& block : blocks) {
    for (const auto& p : block->parameters()) r.param_grads.push_back(p.grad().clone());
  }
  r.next_draw = torch::rand({4}, on_device());
  return r;
}

TEST(ActivationCheckpointing, BlocksOfSeveralInputsAndResultsTrainTheSame) {
  const auto plain = run_list_blocks(nullptr);
  ActivationCheckpointing checkpointing({}, nullptr);
  expect_same(plain, run_list_blocks(&checkpointing));
  EXPECT_EQ(checkpointing.stats().recomputes, 2);
  // Each checkpoint kept x-like (384 B), h-like (384 B) and the indices (48 B): two at once at the peak.
  EXPECT_EQ(checkpointing.stats().peak_saved_bytes, 2 * (2 * 6 * 16 * 4 + 6 * 8));
  EXPECT_EQ(checkpointing.stats().saved_bytes, 0);

  ActivationCheckpointing kept_apart(kept_on_cpu_in_slots(2), nullptr);
  expect_same(plain, run_list_blocks(&kept_apart));
  expect_same(plain, run_list_blocks(&kept_apart));  // the slots of both activations are reused
  EXPECT_EQ(kept_apart.stats().recomputes, 4);
}

TEST(ActivationCheckpointing, ResultsThatDoNotReachTheLossPassNothingBack) {
  ActivationCheckpointing checkpointing({}, nullptr);
  DropoutBlock block;
  auto x = torch::randn({5, 16}, on_device()).requires_grad_(true);
  auto run = [unit = block.ptr()](const std::vector<torch::Tensor>& in) {
    return std::vector<torch::Tensor>{unit->forward(in[0]), in[0] * 2};
  };
  auto out = checkpointing.checkpoint(ActivationCheckpointing::ListBlock(run), {x});
  ASSERT_EQ(out.size(), 2u);
  out[1].sum().backward();  // only the second result: x's gradient is 2, the block's parameters get none
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({5, 16}, 2.0, on_device())));
  EXPECT_FALSE(block->fc1->weight.grad().defined());
  EXPECT_EQ(checkpointing.stats().recomputes, 1);
  EXPECT_THROW(checkpointing.checkpoint(ActivationCheckpointing::ListBlock(run), {}), std::invalid_argument);
}

// partition_activations over two real processes that hold the same activations (as a tensor-parallel group does):
// each keeps half of every input (the odd element count pads one slot), and training matches no checkpointing.
int run_partition_worker() {
  auto comm = init_comm(DistEnv::from_env());
  ActivationCheckpointingConfig config;
  config.partition_activations = true;
  ActivationCheckpointing checkpointing(config, comm);
  const auto plain = run_blocks(nullptr);
  const auto partitioned = run_blocks(&checkpointing);
  double max_diff = (plain.loss - partitioned.loss).abs().item<double>();
  max_diff = std::max(max_diff, (plain.input_grad - partitioned.input_grad).abs().max().item<double>());
  for (size_t i = 0; i < plain.param_grads.size(); ++i) {
    max_diff = std::max(max_diff, (plain.param_grads[i] - partitioned.param_grads[i]).abs().max().item<double>());
  }
  std::cout << "max_diff " << max_diff << "\npeak_kept " << checkpointing.stats().peak_saved_bytes << "\nrecomputes "
            << checkpointing.stats().recomputes << std::endl;
  return 0;
}

int64_t field(const std::string& out, const std::string& name) {
  std::istringstream in(out);
  for (std::string key; in >> key;) {
    double value;
    in >> value;
    if (key == name) return static_cast<int64_t>(value);
  }
  return -1;
}

TEST(ActivationCheckpointing, PartitionActivationsOnTwoRanksKeepsHalfAndTrainsTheSame) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto ranks = run_ranks(2, self + " --worker partition", "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=60");
  const int64_t whole = 3 * 7 * 3 * 16 * 4;  // three inputs of 336 floats
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ranks[r].code, 0) << "rank " << r << ":\n" << ranks[r].err;
    EXPECT_NE(ranks[r].out.find("max_diff 0\n"), std::string::npos) << ranks[r].out;
    EXPECT_EQ(field(ranks[r].out, "peak_kept"), whole / 2) << ranks[r].out;
    EXPECT_EQ(field(ranks[r].out, "recomputes"), 3) << ranks[r].out;
  }
}

// gpt-train tiny with dropout 0.1 for 4 steps; rank 0's metrics and log.
struct TrainRun {
  std::vector<nlohmann::json> rows;
  std::string log;
};

TrainRun train(int stage, int world, bool checkpointing, const nlohmann::json& ac_section = nlohmann::json::object(),
               const std::string& model = "tiny --seq_len 32", int steps = 4) {
  const std::string name = "ac_s" + std::to_string(stage) + "_w" + std::to_string(world) + (checkpointing ? "_on" : "_off");
  const auto dir = temp_dir(name);
  nlohmann::json zero = {{"stage", stage}, {"reduce_bucket_size", 30011}};
  if (stage == 3) zero["stage3_param_persistence_threshold"] = 0;
  nlohmann::json ac = ac_section;
  ac["profile"] = true;  // the log then says how many blocks were checkpointed
  const nlohmann::json config = {{"train_batch_size", 8},
                                 {"steps_per_print", steps},
                                 {"zero_optimization", zero},
                                 {"activation_checkpointing", ac},
                                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  std::ofstream(dir / "config.json") << config.dump();
  const auto metrics = dir / "metrics.jsonl";
  const std::string command = gpt_train_command() + " --no_progress --model " + model +
                              " --dropout 0.1 --steps " + std::to_string(steps) + " --deepspeed_config " +
                              (dir / "config.json").string() + " --metrics " + metrics.string() +
                              (checkpointing ? " --activation_checkpointing" : "");
  const auto ranks = run_ranks(world, command, "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=30");
  for (int r = 0; r < world; ++r) EXPECT_EQ(ranks[r].code, 0) << name << " rank " << r << ":\n" << ranks[r].err;
  TrainRun run;
  run.log = ranks[0].err;
  std::istringstream in(read_text(metrics));
  for (std::string line; std::getline(in, line);) run.rows.push_back(nlohmann::json::parse(line));
  return run;
}

struct Shape {
  int stage, world;
};

void PrintTo(const Shape& shape, std::ostream* os) {  // not its bytes (ctest, failures)
  *os << "stage " << shape.stage << ", world " << shape.world;
}

class CheckpointedTraining : public ::testing::TestWithParam<Shape> {};

TEST_P(CheckpointedTraining, LossAndGradNormMatchTrainingWithoutCheckpointing) {
  const auto [stage, world] = GetParam();
  const auto without = train(stage, world, false);
  const auto with = train(stage, world, true);
  ASSERT_EQ(without.rows.size(), 4u);
  ASSERT_EQ(with.rows.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    for (const char* key : {"loss", "grad_norm"}) {
      const double want = without.rows[i][key].get<double>(), got = with.rows[i][key].get<double>();
      EXPECT_LE(std::abs(got - want), 1e-5 * std::abs(want)) << key << " at step " << i + 1;
    }
  }
  // tiny has 4 blocks, checkpointed once per micro-step (one per rank per step here): 16 by step 4.
  EXPECT_NE(with.log.find("activation checkpointing: 16 checkpoints, 16 recomputes"), std::string::npos) << with.log;
  EXPECT_NE(without.log.find("activation checkpointing: 0 checkpoints"), std::string::npos) << without.log;
}

INSTANTIATE_TEST_SUITE_P(Stages, CheckpointedTraining,
                         ::testing::Values(Shape{0, 1}, Shape{0, 2}, Shape{1, 1}, Shape{1, 2}, Shape{2, 1},
                                           Shape{2, 2}, Shape{3, 1}, Shape{3, 2}),
                         [](const auto& info) {
                           return "stage" + std::to_string(info.param.stage) + "_world" +
                                  std::to_string(info.param.world);
                         });

TEST(CheckpointedTraining, EveryConfigKeyOnTwoRanksTrainsTheSame) {
  const nlohmann::json ac = {{"partition_activations", true},
                             {"cpu_checkpointing", true},
                             {"contiguous_memory_optimization", true},
                             {"number_checkpoints", 4},
                             {"synchronize_checkpoint_boundary", true}};
  const auto without = train(2, 2, false);
  const auto with = train(2, 2, true, ac);
  ASSERT_EQ(with.rows.size(), without.rows.size());
  for (size_t i = 0; i < with.rows.size(); ++i) {
    EXPECT_LE(std::abs(with.rows[i]["loss"].get<double>() - without.rows[i]["loss"].get<double>()),
              1e-5 * without.rows[i]["loss"].get<double>());
  }
  // Data-parallel ranks hold activations of their own: partition_activations says it has nothing to split.
  EXPECT_NE(with.log.find("partition_activations: no activation_partition_group"), std::string::npos) << with.log;
}

TEST(CheckpointedTraining, SmallModelAtSequence256NeedsFarLessActivationMemory) {
  // gpt-train small (6 blocks of 256, 8 heads) at its longest sequence: attention's (8, 8, 256, 256) score tensors
  // dominate what a block keeps for backward; checkpointed, only each block's (8, 256, 256) input stays.
  const auto without = train(2, 1, false, nlohmann::json::object(), "small --seq_len 256", 1);
  const auto with = train(2, 1, true, nlohmann::json::object(), "small --seq_len 256", 1);
  ASSERT_EQ(with.rows.size(), 1u);
  ASSERT_EQ(without.rows.size(), 1u);
  const double plain = without.rows[0]["memory_breakdown"]["activations_peak"].get<double>();
  const double checkpointed = with.rows[0]["memory_breakdown"]["activations_peak"].get<double>();
  std::cout << "activations peak: " << plain / 1e6 << " MB without, " << checkpointed / 1e6
            << " MB with activation checkpointing" << std::endl;
  EXPECT_GT(plain, 200e6);
  EXPECT_LT(checkpointed, 0.4 * plain);
  EXPECT_EQ(with.rows[0]["loss"], without.rows[0]["loss"]);
}

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--worker") == 0) {
    try {
      return dscpp::testing::run_partition_worker();
    } catch (const std::exception& e) {
      std::cerr << "worker failed: " << e.what() << std::endl;
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
