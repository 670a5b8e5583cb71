// Training an MoE model with expert parallelism through the engine, over real processes (the binary spawns itself
// with --worker as each rank), against the same model with every expert on one process (ep_size 1): the same global
// batch as that process's gradient accumulation over the data-parallel ranks' micro-batches. 20 steps with gradient
// clipping (the norm must count every expert once), per-step losses within 1e-5; ZeRO 0, 1 and 2; ep 2 on 2
// processes and ep 2 × data 2 on 4; k = 1 and 2; use_residual; offload_optimizer. Also: the expert bytes each rank
// holds, a checkpoint saved at ep 2 resumed at ep 1 and consolidated, one saved at ep 1 resumed at ep 2, and the rules
// the engine states.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "../common/multiprocess.h"
#include "dscpp/checkpoint/safetensors.h"
#include "dscpp/dscpp.h"
#include "dscpp/moe/expert_groups.h"
#include "dscpp/moe/moe_layer.h"
#include "test_expert.h"

namespace dscpp::testing {
namespace {

constexpr int64_t kVocab = 32, kDim = 8, kSeq = 6, kMicro = 4, kSteps = 20;

// Scenario settings, "key=value,…" on the worker's command line.
struct Scenario {
  int ep = 2, k = 1, stage = 0;
  bool drop = true, residual = false, offload = false;  // offload: offload_optimizer cpu (stages 1-2)
  std::string checkpoint;  // a directory: save at step 10, resume it at ep 1 (rank 0 checks)

  static Scenario parse(const std::string& text) {
    Scenario s;
    std::stringstream in(text);
    for (std::string item; std::getline(in, item, ',');) {
      const auto eq = item.find('=');
      const auto key = item.substr(0, eq), value = item.substr(eq + 1);
      if (key == "ep") s.ep = std::stoi(value);
      else if (key == "k") s.k = std::stoi(value);
      else if (key == "stage") s.stage = std::stoi(value);
      else if (key == "drop") s.drop = value == "1";
      else if (key == "residual") s.residual = value == "1";
      else if (key == "offload") s.offload = value == "1";
      else if (key == "checkpoint") s.checkpoint = value;
      else throw std::invalid_argument("unknown scenario key " + key);
    }
    return s;
  }
  std::string str() const {
    return "ep " + std::to_string(ep) + " k " + std::to_string(k) + " ZeRO-" + std::to_string(stage) +
           (drop ? "" : " no-drop") + (residual ? " residual" : "") + (offload ? " offload" : "");
  }
};

// Embedding → x + MoE(x) → head; loss = cross-entropy + 0.01 · l_aux.
class TinyMoELmImpl : public torch::nn::Module {
 public:
  TinyMoELmImpl(const Scenario& s, int ep, std::shared_ptr<Comm> ep_group) {
    moe::MoEOptions o;
    o.hidden_size = kDim;
    o.num_experts = 4;
    o.ep_size = ep;
    o.gate.k = s.k;
    o.gate.drop_tokens = s.drop;
    o.gate.use_rts = false;
    o.gate.top2_2nd_expert_sampling = false;
    o.gate.min_capacity = 0;
    o.use_residual = s.residual;
    torch::manual_seed(5);
    wte = register_module("wte", torch::nn::Embedding(kVocab, kDim));
    moe = register_module("moe", moe::MoE(o, torch::nn::AnyModule(Expert(kDim)), std::move(ep_group)));
    head = register_module("head", torch::nn::Linear(kDim, kVocab));
    give_experts_own_values(*moe);
  }
  torch::Tensor loss(const torch::Tensor& ids, const torch::Tensor& targets) {
    const auto x = wte(ids);
    const auto out = moe->forward(x);
    const auto logits = head(x + out.output);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape({-1})) +
           0.01 * out.l_aux;
  }
  torch::nn::Embedding wte{nullptr};
  moe::MoE moe{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TinyMoELm);

std::string config_json(int stage, int data, int world, bool offload = false) {
  // Global batch data × kMicro rows: `world` ranks of data / world micro-batches each. A small clipping threshold,
  // so the clipped norm decides every step.
  return R"({"train_batch_size": )" + std::to_string(data * kMicro) + R"(, "train_micro_batch_size_per_gpu": )" +
         std::to_string(kMicro) + R"(, "gradient_clipping": 0.1, "zero_optimization": {"stage": )" +
         std::to_string(stage) + (offload ? R"(, "offload_optimizer": {"device": "cpu"})" : "") +
         R"(}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}})";
}

// Step `step`'s rows for micro-batch `micro` of `data` micro-batches.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t step, int micro, int data) {
  auto generator = torch::make_generator<torch::CPUGeneratorImpl>(1000 + step);
  const auto ids = torch::randint(kVocab, {data * kMicro, kSeq}, generator);
  const auto targets = torch::randint(kVocab, {data * kMicro, kSeq}, generator);
  return {ids.narrow(0, micro * kMicro, kMicro), targets.narrow(0, micro * kMicro, kMicro)};
}

struct Trainer {
  TinyMoELm model{nullptr};
  std::unique_ptr<Engine> engine;
  int data = 1;  // micro-batches per step (data-parallel ranks of the compared run)

  // Steps [from, to): this rank's micro-batch, or all `data` of them accumulated on one rank.
  std::vector<double> train(int64_t from, int64_t to, int rank, int ranks) {
    std::vector<double> losses;
    for (int64_t step = from; step < to; ++step) {
      for (int micro = rank; micro < data; micro += ranks) {
        const auto [ids, targets] = batch(step, micro, data);
        engine->backward(engine->forward([&] { return model->loss(ids, targets); }));
        engine->step();
      }
      losses.push_back(engine->last_step().loss);
    }
    return losses;
  }
};

// Every expert on this one process (ep 1), the `data` micro-batches accumulated; with offload, the same CPU Adam at
// ZeRO-1.
Trainer one_process(const Scenario& s, int data, int stage) {
  if (s.offload) stage = std::max(stage, 1);
  Trainer t;
  t.data = data;
  t.model = TinyMoELm(s, 1, nullptr);
  InitOptions options;
  options.comm = make_single_process_comm();
  ConfigOptions config_options;
  config_options.world_size = 1;
  t.engine = initialize(t.model.ptr(), Config::from_string(config_json(stage, data, 1, s.offload), config_options),
                        options);
  return t;
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void check_trajectory(const std::vector<double>& got, const std::vector<double>& want, const std::string& where) {
  check(got.size() == want.size(), where + ": " + std::to_string(got.size()) + " steps");
  for (size_t i = 0; i < got.size(); ++i) {
    check(std::abs(got[i] - want[i]) <= 1e-5, where + ": step " + std::to_string(i + 1) + " loss " +
                                                  std::to_string(got[i]) + ", one process " + std::to_string(want[i]));
  }
}

int64_t expert_bytes(const TinyMoELmImpl& model) {
  int64_t bytes = 0;
  for (const auto& [name, p] : model.moe->expert_parameters()) bytes += p.nbytes();
  return bytes;
}

template <typename Build>
void expect_refused(Build build, const std::string& message) {
  try {
    build();
  } catch (const std::invalid_argument& e) {
    check(std::string(e.what()).find(message) != std::string::npos, std::string("wrong error: ") + e.what());
    return;
  }
  throw std::runtime_error("accepted: " + message);
}

int rules() {
  auto world = init_comm(DistEnv::from_env(), CommBackend::kGloo);
  const auto groups = moe::make_expert_groups(world, 2);
  const Scenario s;
  ConfigOptions config_options;
  config_options.world_size = 2;
  auto build = [&](int stage, bool with_group) {
    InitOptions options;
    options.comm = world;
    if (with_group) options.expert_data_parallel_group = groups.expert_data_parallel;
    TinyMoELm model(s, 2, groups.expert_parallel);
    initialize(model.ptr(), Config::from_string(config_json(stage, 2, 2), config_options), options);
  };
  expect_refused([&] { build(1, false); },
                 "the model's MoE layers spread their experts over ep_size 2 ranks but the engine was given no "
                 "expert-data-parallel group: pass InitOptions::expert_data_parallel_group from "
                 "moe::make_expert_groups(comm, 2)");
  expect_refused([&] { build(3, true); },
                 "ZeRO stage 3 with expert parallelism (ep_size 2) is not supported: stage 3 gathers every parameter "
                 "over the data-parallel group, whose ranks hold different experts; use ZeRO stage 0, 1 or 2");
  world->barrier();
  return 0;
}

int worker(const std::string& text) {
  if (text == "rules") return rules();
  const auto s = Scenario::parse(text);
  auto world = init_comm(DistEnv::from_env(), CommBackend::kGloo);
  const int data = world->world_size();
  const auto groups = moe::make_expert_groups(world, s.ep);
  const std::string where = s.str() + " on " + std::to_string(data) + " ranks, rank " + std::to_string(world->rank());

  Trainer spread;
  spread.data = data;
  spread.model = TinyMoELm(s, s.ep, groups.expert_parallel);
  InitOptions options;
  options.comm = world;
  options.expert_data_parallel_group = groups.expert_data_parallel;
  ConfigOptions config_options;
  config_options.world_size = data;
  spread.engine = initialize(spread.model.ptr(),
                             Config::from_string(config_json(s.stage, data, data, s.offload), config_options), options);
  auto whole = one_process(s, data, 0);
  // Parameter bytes: each rank holds num_experts / ep_size experts.
  check(expert_bytes(*spread.model) * s.ep == expert_bytes(*whole.model),
        where + ": holds " + std::to_string(expert_bytes(*spread.model)) + " expert bytes of " +
            std::to_string(expert_bytes(*whole.model)));

  const int64_t half = s.checkpoint.empty() ? kSteps : kSteps / 2;
  auto losses = spread.train(0, half, world->rank(), data);
  const auto expected = whole.train(0, kSteps, 0, 1);
  if (!s.checkpoint.empty()) {
    spread.engine->save_checkpoint(s.checkpoint, "moe");
    const auto rest = spread.train(half, kSteps, world->rank(), data);
    losses.insert(losses.end(), rest.begin(), rest.end());
    if (world->rank() == 0) {
      // The ep-2 checkpoint resumed by one process holding every expert continues the ep-2 run.
      auto resumed = one_process(s, data, 1);
      resumed.engine->load_checkpoint(s.checkpoint, "moe");
      // `dscpp consolidate` of the ep-2 checkpoint: every expert once, the values the resumed model holds.
      const auto whole_dir = std::filesystem::path(s.checkpoint) / "whole";
      consolidate(s.checkpoint, whole_dir.string(), ConsolidateOptions{"moe"});
      SafetensorsReader weights((whole_dir / "model.safetensors").string());
      for (const auto& item : resumed.model->named_parameters()) {
        check(weights.contains(item.key()), where + ": the consolidated model lacks " + item.key());
        check(torch::equal(weights.read(item.key()), item.value()), where + ": consolidated " + item.key() + " differs");
      }
      resumed.engine->save_checkpoint(s.checkpoint + "/ep1", "one");  // for the way back, below
      check_trajectory(resumed.train(half, kSteps, 0, 1), std::vector<double>(losses.begin() + half, losses.end()),
                       where + ", resumed at ep 1");
    }
    world->barrier();  // rank 0's ep-1 checkpoint is written
    // The way back: one process's checkpoint, holding every expert, resumed at ep 2 continues the ep-2 run.
    Trainer again;
    again.data = data;
    again.model = TinyMoELm(s, s.ep, groups.expert_parallel);
    again.engine = initialize(again.model.ptr(),
                              Config::from_string(config_json(s.stage, data, data, s.offload), config_options), options);
    again.engine->load_checkpoint(s.checkpoint + "/ep1", "one");
    check_trajectory(again.train(half, kSteps, world->rank(), data),
                     std::vector<double>(losses.begin() + half, losses.end()), where + ", ep 1 resumed at ep 2");
  }
  check_trajectory(losses, expected, where);
  world->barrier();
  std::cout << where << ": " << kSteps << " steps equal" << std::endl;
  return 0;
}

void run_scenarios(int world, const std::vector<std::string>& scenarios) {
  const std::string self = "/proc/" + std::to_string(::getpid()) + "/exe";
  for (const auto& scenario : scenarios) {
    const auto ranks = run_ranks(world, self + " --worker " + scenario, "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=1");
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(ranks[r].code, 0) << scenario << " rank " << r << ": " << ranks[r].out << ranks[r].err;
    }
  }
}

TEST(MoEEngine, ExpertParallelTwoRanksTrainAsOneProcess) {
  run_scenarios(2, {"ep=2,k=1,stage=0", "ep=2,k=2,stage=1", "ep=2,k=2,stage=2,residual=1", "ep=2,k=1,stage=2,drop=0"});
}

TEST(MoEEngine, ExpertParallelTimesDataParallelFourRanksTrainAsOneProcess) {
  run_scenarios(4, {"ep=2,k=2,stage=2", "ep=2,k=1,stage=1,residual=1", "ep=2,k=2,stage=2,offload=1"});
}

TEST(MoEEngine, CheckpointsMoveBetweenEp2AndEp1) {
  const auto dir = temp_dir("moe_checkpoint");
  run_scenarios(2, {"ep=2,k=2,stage=1,checkpoint=" + dir.string()});
}

// The rules, each named: a model whose layers spread experts over 2 ranks given no expert-data-parallel group, and
// ZeRO-3 with expert parallelism.
TEST(MoEEngine, TheEngineStatesItsRules) { run_scenarios(2, {"rules"}); }

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) { return dscpp::testing::worker_or_tests(argc, argv, dscpp::testing::worker); }
