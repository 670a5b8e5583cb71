// Tensor-parallel layers against their whole counterparts. Over real processes (the binary spawns itself with
// --worker as each rank): an embedding → column-parallel → GELU → row-parallel → column-parallel head →
// vocab-parallel cross-entropy, on tp 2 and on tp 2 × dp 2, gives the whole model's loss, and each rank's gradients
// are its slices of the whole model's. In one process: the layers are the whole layers, and the errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "../common/gpt_train_runs.h"
#include "../common/multiprocess.h"
#include "dscpp/dscpp.h"
#include "model/gpt.h"

namespace dscpp::testing {
namespace {

constexpr int64_t kVocab = 16, kDim = 8, kHidden = 12, kTokens = 6;

struct Whole {
  torch::nn::Embedding embed{kVocab, kDim};
  torch::nn::Linear up{kDim, kHidden}, down{kHidden, kDim}, head{kDim, kVocab};
};

struct Sliced {
  VocabParallelEmbedding embed;
  ColumnParallelLinear up;
  RowParallelLinear down;
  ColumnParallelLinear head;
  explicit Sliced(const std::shared_ptr<Comm>& g)
      : embed(kVocab, kDim, g),
        up(kDim, kHidden, g, true, /*gather_output=*/false),
        down(kHidden, kDim, g, true, /*input_is_parallel=*/true),
        head(kDim, kVocab, g, true, /*gather_output=*/false) {}
};

torch::Tensor tokens() { return torch::arange(kTokens, torch::kLong) * 5 % kVocab; }
torch::Tensor targets() { return (torch::arange(kTokens, torch::kLong) * 3 + 1) % kVocab; }

bool close(const torch::Tensor& got, const torch::Tensor& want) {
  return got.sizes() == want.sizes() && torch::allclose(got, want, /*rtol=*/1e-5, /*atol=*/1e-6);
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what + " differs from the whole model's");
}

// One forward and backward of both models (built from the same seed); compares the loss, the gathered path
// (gather_output, then a row-parallel layer that scatters its input), and every gradient slice.
void compare(const std::shared_ptr<Comm>& group) {
  torch::manual_seed(7);
  Whole whole;
  torch::manual_seed(7);
  Sliced sliced(group);  // drawn in the same order: the same values, sliced

  auto h = torch::gelu(whole.up(whole.embed(tokens())));
  auto want = torch::nn::functional::cross_entropy(whole.head(whole.down(h)), targets());
  want.backward();
  auto hs = torch::gelu(sliced.up(sliced.embed(tokens())));
  auto got = vocab_parallel_cross_entropy(sliced.head(sliced.down(hs)), targets(), group);
  got.backward();
  check(close(got, want), "the loss");

  const int p = group->world_size(), r = group->rank();
  auto rows = [&](const torch::Tensor& t) { return t.chunk(p, 0)[r]; };
  auto columns = [&](const torch::Tensor& t) { return t.chunk(p, 1)[r]; };
  check(close(sliced.embed->weight.grad(), rows(whole.embed->weight.grad())), "the embedding's gradient");
  check(close(sliced.up->weight.grad(), rows(whole.up->weight.grad())), "the column layer's weight gradient");
  check(close(sliced.up->bias.grad(), rows(whole.up->bias.grad())), "the column layer's bias gradient");
  check(close(sliced.down->weight.grad(), columns(whole.down->weight.grad())), "the row layer's weight gradient");
  check(close(sliced.down->bias.grad(), whole.down->bias.grad()), "the row layer's bias gradient");
  check(close(sliced.head->weight.grad(), rows(whole.head->weight.grad())), "the head's weight gradient");

  // gather_output, and a row layer whose input arrives whole: outputs and the input's gradient.
  torch::manual_seed(9);
  torch::nn::Linear a(kDim, kHidden), b(kHidden, kDim);
  torch::manual_seed(9);
  ColumnParallelLinear as(kDim, kHidden, group, true, /*gather_output=*/true);
  RowParallelLinear bs(kHidden, kDim, group, true, /*input_is_parallel=*/false);
  auto x = torch::randn({kTokens, kDim}).requires_grad_(true);
  auto xs = x.detach().clone().requires_grad_(true);
  auto y = b(a(x)), ys = bs(as(xs));
  check(close(ys, y), "the gathered path's output");
  y.pow(2).sum().backward();
  ys.pow(2).sum().backward();
  check(close(xs.grad(), x.grad()), "the gathered path's input gradient");
}

// The engine over a tensor-parallel model: the same module class over a model-parallel group of one rank is the
// whole model, which the reference trains alone (stage 0, one process) on the whole global batch.
struct TinyLmImpl : torch::nn::Module {
  explicit TinyLmImpl(const std::shared_ptr<Comm>& g) : group(g) {
    embed = register_module("embed", VocabParallelEmbedding(kVocab, kDim, g));
    up = register_module("up", ColumnParallelLinear(kDim, kHidden, g, true, /*gather_output=*/false));
    down = register_module("down", RowParallelLinear(kHidden, kDim, g, true, /*input_is_parallel=*/true));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    head = register_module("head", ColumnParallelLinear(kDim, kVocab, g, false, /*gather_output=*/false));
  }
  torch::Tensor loss(const torch::Tensor& ids, const torch::Tensor& targets) {
    auto x = embed(ids);
    x = norm(x + down(torch::gelu(up(x))));
    return vocab_parallel_cross_entropy(head(x).reshape({-1, kVocab / group->world_size()}), targets.reshape({-1}),
                                        group);
  }
  std::shared_ptr<Comm> group;
  VocabParallelEmbedding embed{nullptr};
  ColumnParallelLinear up{nullptr}, head{nullptr};
  RowParallelLinear down{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(TinyLm);

constexpr int64_t kBatch = 8, kSeq = 4, kSteps = 6;

std::string engine_config(int stage, int dp) {
  // A small clipping threshold, so the clipped norm (the whole model's) decides every step.
  return R"({"train_batch_size": )" + std::to_string(kBatch) + R"(, "train_micro_batch_size_per_gpu": )" +
         std::to_string(kBatch / dp) + R"(, "gradient_clipping": 0.05, "zero_optimization": {"stage": )" +
         std::to_string(stage) + R"(}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}})";
}

struct Run {
  std::vector<double> losses, norms;
  TinyLm model{nullptr};
};

// kSteps steps on the micro-batch rows of data-parallel rank `dp_rank` of `dp`.
Run train(const std::shared_ptr<Comm>& dp_group, const std::shared_ptr<Comm>& model_group, int stage) {
  const int dp = dp_group->world_size();
  torch::manual_seed(3);
  Run run;
  run.model = TinyLm(model_group);
  InitOptions options;
  options.comm = dp_group;
  options.model_parallel_group = model_group;
  options.model_parallel_slices = tensor_parallel_slices(*run.model);
  ConfigOptions config_options;
  config_options.world_size = dp;
  auto engine = initialize(run.model.ptr(), Config::from_string(engine_config(stage, dp), config_options), options);
  for (int64_t k = 0; k < kSteps; ++k) {
    auto generator = torch::make_generator<torch::CPUGeneratorImpl>(100 + k);
    auto ids = torch::randint(kVocab, {kBatch, kSeq}, generator);
    auto targets = torch::randint(kVocab, {kBatch, kSeq}, generator);
    const int64_t rows = kBatch / dp, begin = dp_group->rank() * rows;
    engine->backward(engine->forward(
        [&] { return run.model->loss(ids.narrow(0, begin, rows), targets.narrow(0, begin, rows)); }));
    engine->step();
    run.losses.push_back(engine->last_step().loss);
    run.norms.push_back(engine->last_step().grad_norm);
  }
  if (model_group->world_size() > 1) {
    try {
      engine->save_checkpoint("/nonexistent");
      throw std::runtime_error("a tensor-parallel save_checkpoint without the world group was not refused");
    } catch (const std::logic_error& e) {
      if (std::string(e.what()).find("save_checkpoint: a tensor-parallel run needs InitOptions::world_group") ==
          std::string::npos) {
        throw;
      }
    }
  }
  return run;
}

// Per-step losses and gradient norms within 1e-5, and every parameter this rank's slice of the whole one's.
void compare_training(const ParallelGroups& groups, int stage) {
  const auto whole = train(make_single_process_comm(), make_single_process_comm(), 0);
  const auto sliced = train(groups.data, groups.model, stage);
  const std::string where = "stage " + std::to_string(stage) + ": ";
  for (int64_t k = 0; k < kSteps; ++k) {
    if (std::abs(sliced.losses[k] - whole.losses[k]) > 1e-5 ||
        std::abs(sliced.norms[k] - whole.norms[k]) > 1e-5 * whole.norms[k]) {
      throw std::runtime_error(where + "step " + std::to_string(k) + ": loss " + std::to_string(sliced.losses[k]) +
                               " norm " + std::to_string(sliced.norms[k]) + ", the whole model's " +
                               std::to_string(whole.losses[k]) + " and " + std::to_string(whole.norms[k]));
    }
  }
  auto reference = whole.model->named_parameters();
  const int p = groups.model->world_size(), r = groups.model->rank();
  for (const auto& item : sliced.model->named_parameters()) {
    auto want = reference[item.key()];
    for (int64_t d = 0; d < want.dim(); ++d) {
      if (want.size(d) != item.value().size(d)) want = want.chunk(p, d)[r];
    }
    if (!torch::allclose(item.value(), want, 1e-4, 1e-6)) {
      throw std::runtime_error(where + item.key() + " after training differs from the whole model's");
    }
  }
}

// The GPT sliced over the group holds GptConfig::num_params_per_rank parameters (what `dscpp plan` prints).
void check_gpt_slices(const std::shared_ptr<Comm>& group) {
  auto config = gpt::GptConfig::preset("tiny", 256);
  gpt::Gpt model(config, gpt::GptImpl::BlockBuilt{}, group);
  int64_t held = 0;
  for (const auto& p : model->parameters()) held += p.numel();
  if (held != config.num_params_per_rank(group->world_size())) {
    throw std::runtime_error("the sliced GPT holds " + std::to_string(held) + " parameters, num_params_per_rank " +
                             std::to_string(config.num_params_per_rank(group->world_size())));
  }
  // A vocabulary the group does not divide is refused, naming the numbers and the rule.
  if (group->world_size() == 1) return;
  try {
    gpt::Gpt odd(gpt::GptConfig::preset("tiny", 257), gpt::GptImpl::BlockBuilt{}, group);
    throw std::runtime_error("a vocabulary of 257 was sliced");
  } catch (const std::invalid_argument& e) {
    const std::string rule = "vocab_size 257 does not divide over the tensor-parallel size";
    if (std::string(e.what()).find(rule) == std::string::npos) throw;
  }
}

int worker(const std::string& scenario) {
  if (scenario == "engine") {
    auto world = init_comm(DistEnv::from_env(), CommBackend::kGloo);
    const auto groups = make_parallel_groups(world, ProcessTopology(world->world_size(), 1, 2));
    for (int stage : {0, 1, 2, 3}) compare_training(groups, stage);
    world->barrier();
    return 0;
  }
  auto world = init_comm(DistEnv::from_env(), CommBackend::kGloo);
  const int tp = scenario == "tp2dp2" ? 2 : world->world_size();
  const auto groups = make_parallel_groups(world, ProcessTopology(world->world_size(), 1, tp));
  compare(groups.model);
  check_gpt_slices(groups.model);
  try {
    ColumnParallelLinear(kDim, 13, groups.model);
    throw std::runtime_error("13 output features over 2 ranks were accepted");
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find("out_features 13 does not divide over the tensor-parallel size 2") ==
        std::string::npos) {
      throw;
    }
  }
  world->barrier();
  std::cout << "rank " << world->rank() << " ok" << std::endl;
  return 0;
}

TEST(TensorParallel, OneRankIsTheWholeModel) { compare(make_single_process_comm()); }

TEST(TensorParallel, SlicesOverRealProcessesGiveTheWholeModelsLossAndGradients) {
  const std::string self = "/proc/" + std::to_string(::getpid()) + "/exe";
  for (const auto& [scenario, world] : std::vector<std::pair<std::string, int>>{{"tp2", 2}, {"tp2dp2", 4}}) {
    const auto ranks = run_ranks(world, self + " --worker " + scenario, "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=1");
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(ranks[r].code, 0) << scenario << " rank " << r << ": " << ranks[r].out << ranks[r].err;
    }
  }
}

// tp 2 and tp 2 × dp 2 through the engine at every ZeRO stage: the whole model's per-step losses and clipped
// gradient norms (each slice counted once, whole parameters once), and each rank's slice of its weights.
TEST(TensorParallel, TheEngineTrainsASlicedModelAsTheWholeOne) {
  const std::string self = "/proc/" + std::to_string(::getpid()) + "/exe";
  for (int world : {2, 4}) {
    const auto ranks = run_ranks(world, self + " --worker engine", "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=1");
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(ranks[r].code, 0) << "world " << world << " rank " << r << ": " << ranks[r].err;
    }
  }
}

// gpt-train --tensor_parallel: 20 steps of the tiny GPT (global batch 8, clipping at 1.0) sliced over 2 ranks, and
// over 2 × 2 with ZeRO-1 and ZeRO-3 (built partitioned) over the data-parallel pairs, give the per-step losses and
// gradient norms of stage 0 on one process.
TEST(TensorParallel, GptTrainSlicedGivesTheOneProcessLosses) {
  const auto whole = gpt_train_adamw(1, 0, "");
  ASSERT_EQ(whole.size(), 20u);
  for (const auto& [world, stage] : std::vector<std::pair<int, int>>{{2, 0}, {4, 1}, {4, 3}}) {
    SCOPED_TRACE("world " + std::to_string(world) + ", ZeRO-" + std::to_string(stage));
    const auto sliced = gpt_train_adamw(world, stage, "--tensor_parallel 2");
    expect_same_trajectory(sliced, whole);
  }
}

// Dropout 0.1 everywhere (embeddings, attention weights, residual branches): a sliced run drops what the unsliced
// run drops (each rank draws the whole attention mask and keeps its heads), also when ZeRO-3 recomputes
// checkpointed blocks: tp 2 against one process, and tp 2 × dp 2 against dp 2 (data-parallel ranks draw their own
// masks, so a data-parallel run with dropout is not one process's run).
TEST(TensorParallel, GptTrainSlicedDropsWhatTheUnslicedRunDrops) {
  const std::string flags = "--dropout 0.1 --activation_checkpointing ";
  const auto one = gpt_train_adamw(1, 0, flags);
  EXPECT_GT(std::abs(one[0]["loss"].get<double>() - gpt_train_adamw(1, 0, "")[0]["loss"].get<double>()), 1e-3)
      << "dropout must change the run";
  expect_same_trajectory(gpt_train_adamw(2, 0, flags + "--tensor_parallel 2"), one);
  expect_same_trajectory(gpt_train_adamw(4, 3, flags + "--tensor_parallel 2"), gpt_train_adamw(2, 3, flags));
}

// The rules a sliced GPT must meet, each named with its numbers.
TEST(TensorParallel, GptTrainNamesWhatDoesNotSlice) {
  const std::string gpt = std::string(DSCPP_BINARY_DIR) + "/gpt-train --no_progress --model tiny --steps 1 ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--tensor_parallel 3", "pipeline stages 1 x tensor-parallel size 3 = 3 does not divide the world size 2"},
      {"--tensor_parallel 2 --n_head 3 --n_embd 48", "n_head 3 does not divide over the tensor-parallel size 2"},
      {"--tensor_parallel 2 --save_16bit /tmp/x", "--save_16bit with tensor parallelism (2 ranks per model)"},
  };
  expect_gpt_train_refuses(gpt, cases);
}

TEST(TensorParallel, OneRankTakesAnySize) {
  // The divisibility rule is over the group's size; one rank holds everything.
  EXPECT_NO_THROW(ColumnParallelLinear(kDim, 13, make_single_process_comm()));
  EXPECT_THROW(VocabParallelEmbedding(kVocab, kDim, nullptr), std::invalid_argument);
  EXPECT_THROW(vocab_parallel_cross_entropy(torch::zeros({2, 3, 4}), targets(), make_single_process_comm()),
               std::invalid_argument);
}

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--worker") == 0) {
    try {
      return dscpp::testing::worker(argv[2]);
    } catch (const std::exception& e) {
      std::cerr << "worker " << argv[2] << " failed: " << e.what() << std::endl;
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
