// ZeRO-3 with frozen parameters, the shape of a LoRA fine-tune: frozen base layers with small trainable adapters
// beside them, a block with nothing to train, a frozen input layer outside every unit. The frozen parameters are
// partitioned like the trainable ones (each rank holds 1/N), gathered with their unit and released in backward
// once the unit's nodes have run — so at most a couple of blocks are whole at once — and the run equals stage 0 on
// one process, through a checkpoint saved at one layout and resumed at another. An engine built forward only holds
// every parameter frozen: its shards (here on NVMe) and nothing for training.
// This binary spawns itself with --worker as each rank (the engine joins from the torchrun-style env).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>

#include "../common/multiprocess.h"
#include "../common/seeded_rows.h"
#include "../common/test_device.h"
#include "dscpp/engine/engine.h"

namespace dscpp::testing {
namespace {

constexpr int kWidth = 32;
constexpr int kRank = 4;  // the adapters'
constexpr int kBlocks = 4;
constexpr int kFrozenBlock = 2;  // no adapter: nothing of it trains
constexpr int kGlobalBatch = 8;
constexpr int kSteps = 6;

// tanh(base(x) + B(A x)), base frozen.
struct AdaptedImpl : torch::nn::Module {
  explicit AdaptedImpl(bool adapter) {
    base = register_module("base", torch::nn::Linear(kWidth, kWidth));
    for (auto& p : base->parameters()) p.set_requires_grad(false);
    if (adapter) {
      a = register_parameter("lora_a", torch::randn({kRank, kWidth}) * 0.1);
      b = register_parameter("lora_b", torch::randn({kWidth, kRank}) * 0.1);
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = base->forward(x);
    if (a.defined()) h = h + torch::matmul(torch::matmul(x, a.t()), b.t());
    return torch::tanh(h);
  }
  torch::nn::Linear base{nullptr};
  torch::Tensor a, b;
};
TORCH_MODULE(Adapted);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    in = register_module("in", torch::nn::Linear(kWidth, kWidth));
    for (auto& p : in->parameters()) p.set_requires_grad(false);
    for (int i = 0; i < kBlocks; ++i) {
      blocks.push_back(register_module("block" + std::to_string(i), Adapted(i != kFrozenBlock)));
    }
    out = register_module("out", torch::nn::Linear(kWidth, 1));
    to(test_device());
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  std::vector<Adapted> blocks;
};
TORCH_MODULE(Net);


int64_t bytes(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel() * 4;
  return n;
}

// The engine's forward, without gradients, of a fixed input (4 rows): the sum of the outputs. Collective under ZeRO-3.
double probe(Net& net, Engine& engine) {
  torch::NoGradGuard no_grad;
  const auto x = seeded_rows(100, 4, kWidth).first.to(test_device());
  const auto out = engine.forward([&] {
    auto h = torch::tanh(net->in->forward(x));
    for (auto& block : net->blocks) h = engine.run_unit(*block, [&] { return block->forward(h); });
    return net->out->forward(h).sum();
  });
  return out.item<double>();
}

// Prints each step's loss, then "frozen <bytes this rank holds>", "peak <most gathered at once>", "block <bytes of
// the largest block>", "root <bytes outside the blocks>", "sum <sum of the frozen parameters' whole values>",
// "probe <probe() after the steps>".
// `load`: a checkpoint to resume from ("-": none; the model is then built from another seed, so every frozen value
// must come from the checkpoint); `save`: where to save after the steps ("-": nowhere); `quantized`: ZeRO++'s
// zero_quantized_nontrainable_weights.
int run_worker(int stage, const std::string& load, const std::string& save, bool quantized) {
  const auto env = DistEnv::from_env();
  const nlohmann::json json = {
      {"train_batch_size", kGlobalBatch},
      {"steps_per_print", 1000},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"weight_decay", 0.01}}}}},
      {"zero_optimization",
       {{"stage", stage},
        {"stage3_param_persistence_threshold", 0},
        {"stage3_max_reuse_distance", 0},
        {"stage3_prefetch_bucket_size", 0},
        {"zero_quantized_nontrainable_weights", quantized}}}};
  ConfigOptions options;
  options.world_size = env.world_size;
  const auto config = Config::from_string(json.dump(), options);
  torch::manual_seed(load == "-" ? 1 : 2);
  Net net;
  const int64_t block_bytes = bytes(*net->blocks[0]), root_bytes = bytes(*net->in) + bytes(*net->out);
  InitOptions init;
  for (const auto& block : net->blocks) init.gather_units.push_back(block.ptr());
  auto engine = initialize(net.ptr(), config, init);
  int64_t first_step = 0;
  if (load != "-") {
    engine->load_checkpoint(load);
    first_step = engine->global_steps();
  }
  const int64_t micro = kGlobalBatch / env.world_size;
  for (int64_t step = first_step; step < first_step + kSteps; ++step) {
    auto [x, y] = seeded_rows(env.rank * micro, micro, kWidth);  // the same batch every step: the loss must fall
    auto loss = engine->forward([&] {
      auto h = torch::tanh(net->in->forward(x.to(test_device())));
      for (auto& block : net->blocks) {
        h = engine->run_unit(*block, [&] { return block->forward(h); });
      }
      return torch::mse_loss(net->out->forward(h), y.to(test_device()));
    });
    engine->backward(loss);
    engine->step();
    if (env.rank == 0) std::cout << engine->last_step().loss << std::endl;
  }
  if (save != "-") engine->save_checkpoint(save);
  double sum = 0;
  for (const auto& p : net->parameters()) {
    if (!p.requires_grad()) sum += engine->whole_parameter(p).sum().item().toDouble();
  }
  const auto memory = engine->memory().stage;
  const double probed = probe(net, *engine);
  if (env.rank == 0) {
    std::cout << "frozen " << memory.frozen << "\npeak " << memory.gathered_peak << "\nblock " << block_bytes
              << "\nroot " << root_bytes << "\nsum " << sum << "\nprobe " << probed << std::endl;
  }
  return 0;
}

// InitOptions::forward_only (ZeRO-Inference, a reference model) at ZeRO `stage`: no optimizer in the config, every
// parameter held frozen — at ZeRO-3 the shards on NVMe under `nvme` ("-": in memory). Prints "output <|engine's
// forward − the same model's forward before initialize|>", the stage's memory ("frozen", "grads", "master",
// "params"), "whole <the model's bytes>", the error of backward, then loads `trained` (a checkpoint with trained
// parameters) and prints "probe <probe()>" and "steps <its global steps>".
int run_forward_only(int stage, const std::string& nvme, const std::string& trained) {
  const auto env = DistEnv::from_env();
  nlohmann::json zero = {{"stage", stage}, {"stage3_param_persistence_threshold", 0}};
  if (nvme != "-") zero["offload_param"] = {{"device", "nvme"}, {"nvme_path", nvme}};
  const nlohmann::json json = {{"train_batch_size", kGlobalBatch}, {"zero_optimization", zero}};
  ConfigOptions options;
  options.world_size = env.world_size;
  torch::manual_seed(2);  // not the trained run's seed: every value must come from the checkpoint
  Net net, reference;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < net->parameters().size(); ++i) reference->parameters()[i].copy_(net->parameters()[i]);
  }
  InitOptions init;
  init.forward_only = true;
  for (const auto& block : net->blocks) init.gather_units.push_back(block.ptr());
  auto engine = initialize(net.ptr(), Config::from_string(json.dump(), options), init);
  auto x = seeded_rows(0, 4, kWidth).first.to(test_device());
  auto run = [&](Net& m, Engine* e) {
    auto h = torch::tanh(m->in->forward(x));
    for (auto& block : m->blocks) h = e ? e->run_unit(*block, [&] { return block->forward(h); }) : block->forward(h);
    return m->out->forward(h);
  };
  torch::Tensor out;
  auto loss = engine->forward([&] { return (out = run(net, engine.get())).sum(); });
  const auto want = run(reference, nullptr);
  std::string backward = "none";
  try {
    engine->backward(loss);
  } catch (const std::logic_error& e) {
    backward = e.what();
  }
  const auto memory = engine->memory().stage;
  engine->load_checkpoint(trained);
  const double probed = probe(net, *engine);
  if (env.rank == 0) {
    std::cout << "output " << (out - want).abs().max().item<double>() << "\nfrozen " << memory.frozen << "\ngrads "
              << memory.grads16 << "\nmaster " << memory.master << "\nparams " << memory.params16
              << "\nwhole " << bytes(*reference) << "\nbackward " << backward << "\nprobe " << probed
              << "\nsteps " << engine->global_steps() << std::endl;
  }
  return 0;
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, double> values;
};

Run parse(const std::string& out) {
  Run run;
  std::istringstream in(out);
  for (std::string word; in >> word;) {
    if (std::isalpha(static_cast<unsigned char>(word[0]))) {
      in >> run.values[word];
    } else {
      run.losses.push_back(std::stod(word));
    }
  }
  return run;
}

Run run(int world, int stage, const std::string& load, const std::string& save, bool quantized = false) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto ranks = run_ranks(world,
                               self + " --worker " + std::to_string(stage) + " " + load + " " + save + " " +
                                   std::to_string(quantized ? 1 : 0),
                               "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=60");
  for (int r = 0; r < world; ++r) EXPECT_EQ(ranks[r].code, 0) << "rank " << r << ":\n" << ranks[r].err;
  return parse(ranks[0].out);
}

void expect_losses(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - want[i]), 1e-5 * std::abs(want[i])) << what << ", step " << i + 1;
  }
}

TEST(Zero3Frozen, PartitionsFrozenParametersAndTrainsAsStage0OnOneProcess) {
  const auto dir = temp_dir("zero3_frozen");
  const auto reference = run(1, 0, "-", (dir / "one").string());
  const auto ranks = run(2, 3, "-", (dir / "two").string());
  expect_losses(ranks.losses, reference.losses, "2 ranks at ZeRO-3");
  EXPECT_LT(reference.losses.back(), reference.losses.front());
  // Each rank holds half of the frozen parameters (each group padded to an even count: at most one element more).
  const double frozen_total = (kBlocks + 1) * (kWidth * kWidth + kWidth) * 4.0;  // every base and the input layer
  EXPECT_EQ(reference.values.at("frozen"), frozen_total);  // stage 0 holds them whole
  EXPECT_GE(ranks.values.at("frozen"), frozen_total / 2);
  EXPECT_LE(ranks.values.at("frozen"), frozen_total / 2 + 4 * (kBlocks + 1));
  // Backward releases each block's frozen base once its nodes have run: never more than two blocks are whole.
  // (Kept to the end of backward, all four would be.)
  EXPECT_LE(ranks.values.at("peak"), ranks.values.at("root") + 2 * ranks.values.at("block") + 64);
  EXPECT_GE(ranks.values.at("peak"), ranks.values.at("block"));
  // Frozen values never change.
  EXPECT_NEAR(ranks.values.at("sum"), reference.values.at("sum"), 1e-4 * std::abs(reference.values.at("sum")));

  // Resume both ways: the 2-rank ZeRO-3 checkpoint on one process at stage 0, the 1-process one on 2 ranks at
  // ZeRO-3; both continue as the other layout's own run does (the reference's next steps).
  const auto continued = run(1, 0, (dir / "one").string(), "-");
  const auto from_zero3 = run(1, 0, (dir / "two").string(), "-");
  const auto into_zero3 = run(2, 3, (dir / "one").string(), "-");
  ASSERT_EQ(continued.losses.size(), static_cast<size_t>(kSteps));
  expect_losses(from_zero3.losses, continued.losses, "2-rank ZeRO-3 checkpoint resumed on 1 process");
  expect_losses(into_zero3.losses, continued.losses, "1-process checkpoint resumed on 2 ranks at ZeRO-3");
  EXPECT_NEAR(into_zero3.values.at("sum"), reference.values.at("sum"), 1e-4 * std::abs(reference.values.at("sum")));
}

TEST(Zero3Frozen, QuantizedNontrainableWeightsStoreAQuarterAndTrainClose) {
  // ZeRO++'s zero_quantized_nontrainable_weights: each rank keeps its frozen shards as int8 blocks (one fp32 scale
  // per block), gathered as they are; the adapters train on the dequantized base.
  const auto exact = run(2, 3, "-", "-");
  const auto quantized = run(2, 3, "-", "-", /*quantized=*/true);
  ASSERT_EQ(quantized.losses.size(), exact.losses.size());
  for (size_t i = 0; i < exact.losses.size(); ++i) {
    EXPECT_LE(std::abs(quantized.losses[i] - exact.losses[i]), 0.02 * exact.losses[i]) << "step " << i + 1;
  }
  EXPECT_LE(quantized.values.at("frozen"), 0.27 * exact.values.at("frozen"));
  EXPECT_GE(quantized.values.at("frozen"), 0.25 * exact.values.at("frozen"));
  // The frozen values read back whole are the blocks' (close to the exact ones, and not them).
  const double sum = exact.values.at("sum"), quantized_sum = quantized.values.at("sum");
  EXPECT_NE(quantized_sum, sum);
  EXPECT_NEAR(quantized_sum, sum, 0.05);
}

// A forward-only engine on 2 ranks at `stage` (shards on NVMe under `nvme`, "-": none), given the trained checkpoint
// `trained`: its outputs, memory and refusals, by key.
std::map<std::string, std::string> forward_only(int stage, const std::string& nvme, const std::string& trained) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto ranks = run_ranks(2, self + " --forward-only " + std::to_string(stage) + " " + nvme + " " + trained,
                               "OMP_NUM_THREADS=1");
  EXPECT_EQ(ranks[0].code, 0) << ranks[0].err;
  EXPECT_EQ(ranks[1].code, 0) << ranks[1].err;
  std::map<std::string, std::string> got;
  std::istringstream in(ranks[0].out);
  for (std::string key, value; in >> key && std::getline(in, value);) got[key] = value.substr(1);
  return got;
}

TEST(Zero3Frozen, ForwardOnlyHoldsOnlyTheWeightsOnNvmeRefusesTrainingAndLoadsTrainedWeights) {
  const auto dir = temp_dir("zero3_forward_only");
  std::filesystem::create_directories(dir / "nvme");
  const auto trained = run(1, 3, "-", (dir / "trained").string());  // a checkpoint with trained parameters
  const auto got = forward_only(3, (dir / "nvme").string(), (dir / "trained").string());
  ASSERT_TRUE(got.count("output")) << "the ranks failed";
  EXPECT_LT(std::stod(got.at("output")), 1e-6);  // the whole model's forward
  // Nothing in memory for the weights (on NVMe), nothing for training (one padding element of the empty layout).
  EXPECT_EQ(std::stoll(got.at("frozen")), 0);
  EXPECT_LE(std::stoll(got.at("grads")) + std::stoll(got.at("master")) + std::stoll(got.at("params")), 16);
  EXPECT_NE(got.at("backward").find("built forward only"), std::string::npos) << got.at("backward");
  // The trained parameters (adapters, output layer) and the frozen ones load into the shards: the trained model.
  EXPECT_NEAR(std::stod(got.at("probe")), trained.values.at("probe"), 1e-5 * std::abs(trained.values.at("probe")));
  EXPECT_EQ(std::stoll(got.at("steps")), kSteps);
}

TEST(Zero3Frozen, ForwardOnlyBelowStage3HoldsTheWholeWeightsOnlyAndLoadsTrainedWeights) {
  // TRL's reference model below ZeRO-3 (its prepare_deepspeed sets stage 0): the weights whole on every rank in the
  // compute dtype, no fp32 master, gradient buffer or optimizer state.
  const auto dir = temp_dir("forward_only_below_3");
  const auto trained = run(1, 0, "-", (dir / "trained").string());
  for (const int stage : {0, 2}) {
    const auto got = forward_only(stage, "-", (dir / "trained").string());
    ASSERT_TRUE(got.count("output")) << "stage " << stage << ": the ranks failed";
    EXPECT_LT(std::stod(got.at("output")), 1e-6) << "stage " << stage;
    const int64_t whole = std::stoll(got.at("whole"));
    EXPECT_EQ(std::stoll(got.at("frozen")), whole) << "stage " << stage;
    EXPECT_LE(std::stoll(got.at("params")), whole + 16) << "stage " << stage;  // + the empty layout's padding
    EXPECT_LE(std::stoll(got.at("grads")) + std::stoll(got.at("master")), 16) << "stage " << stage;
    EXPECT_NE(got.at("backward").find("built forward only"), std::string::npos) << got.at("backward");
    EXPECT_NEAR(std::stod(got.at("probe")), trained.values.at("probe"), 1e-5 * std::abs(trained.values.at("probe")))
        << "stage " << stage;
    EXPECT_EQ(std::stoll(got.at("steps")), kSteps) << "stage " << stage;
  }
}

TEST(Zero3Frozen, QuantizedNontrainableWeightsBelowStage3AreRefusedNamingTheKey) {
  const auto self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto ranks = run_ranks(1, self + " --worker 2 - - 1", "OMP_NUM_THREADS=1");
  EXPECT_NE(ranks[0].code, 0);
  EXPECT_NE(ranks[0].err.find("zero_quantized_nontrainable_weights"), std::string::npos) << ranks[0].err;
  EXPECT_NE(ranks[0].err.find("below stage 3"), std::string::npos) << ranks[0].err;
}

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--forward-only") == 0) {
    try {
      return dscpp::testing::run_forward_only(std::atoi(argv[2]), argv[3], argv[4]);
    } catch (const std::exception& e) {
      std::cerr << "worker failed: " << e.what() << std::endl;
      return 1;
    }
  }
  if (argc >= 5 && std::strcmp(argv[1], "--worker") == 0) {
    try {
      return dscpp::testing::run_worker(std::atoi(argv[2]), argv[3], argv[4], argc > 5 && std::atoi(argv[5]) != 0);
    } catch (const std::exception& e) {
      std::cerr << "worker failed: " << e.what() << std::endl;
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
