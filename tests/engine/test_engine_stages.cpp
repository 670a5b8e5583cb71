// The ZeRO stages on one process, through the engine: what every stage must agree on, and the hazards of taking
// gradients from hooks (stage 2): unused parameters, tied parameters, backward outside the engine.
#include <gtest/gtest.h>

#include "dscpp/dscpp.h"
#include "test_models.h"

#include <functional>
#include <map>

namespace dscpp::testing {
namespace {

// An MLP with a parameter the loss never uses and a weight registered under two names.
struct QuirkyImpl : torch::nn::Module {
  QuirkyImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
    unused = register_parameter("unused", torch::ones({5}));
    register_parameter("fc1_weight_again", fc1->weight);  // tied: the same tensor twice
    to(test_device());
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    const auto device = fc1->weight.device();
    return torch::mse_loss(fc2->forward(torch::tanh(fc1->forward(x.to(device)))), y.to(device));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor unused;
};
TORCH_MODULE(Quirky);

// `offload`: the optimizer on the host (offload_optimizer cpu), stepping sub-groups of 37 elements that straddle
// the 50-element communication groups.
std::string config_json(int stage, int grad_accum, bool offload = false) {
  const std::string offload_keys = offload ? R"(, "offload_optimizer": {"device": "cpu"}, "sub_group_size": 37)" : "";
  return R"({"train_batch_size": 16, "gradient_accumulation_steps": )" + std::to_string(grad_accum) +
         R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
         R"(, "reduce_bucket_size": 50, "overlap_comm": true, "stage3_param_persistence_threshold": 0)" +
         offload_keys + R"(},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}, "gradient_clipping": 0.5})";
}

// The trained parameters by name (stage 3 orders its groups differently).
std::map<std::string, torch::Tensor> train(int stage, int grad_accum, Quirky& model, bool offload = false) {
  torch::manual_seed(0);
  model = Quirky();
  auto engine = initialize(model.ptr(), config_from(config_json(stage, grad_accum, offload)));
  auto [x, y] = regression_data(5 * 16);
  const int64_t micro = 16 / grad_accum;
  for (int64_t row = 0; row < x.size(0); row += micro) {
    engine->backward(engine->forward([&] { return model->loss(x.narrow(0, row, micro), y.narrow(0, row, micro)); }));
    engine->step();
  }
  std::map<std::string, torch::Tensor> out;
  engine->visit_parameters([&](const std::string& name, const torch::Tensor& p) { out[name] = p.detach().clone(); });
  return out;
}

TEST(EngineStages, EveryStageMatchesStage0WithUnusedAndTiedParameters) {
  Quirky reference_model{nullptr};
  const auto reference = train(0, 1, reference_model);
  for (int stage : {0, 1, 2, 3, -1, -2, -3}) {  // negative: that stage with the optimizer offloaded
    for (int gas : {1, 4}) {
      Quirky model{nullptr};
      const auto params = train(std::abs(stage), gas, model, stage < 0);
      ASSERT_EQ(params.size(), reference.size());
      for (const auto& [name, value] : reference) {
        ASSERT_TRUE(params.count(name)) << name;
        EXPECT_TRUE(torch::allclose(params.at(name), value, 1e-5, 1e-6)) << "stage " << stage << " gas " << gas << " " << name;
      }
      // The unused parameter is only decayed (AdamW), never moved by a gradient.
      EXPECT_TRUE(torch::allclose(params.at("unused"),
                                  torch::full({5}, std::pow(1 - 0.01 * 0.1, 5), params.at("unused").options())));
      // The tied weight is one tensor: both names still alias it.
      EXPECT_TRUE(model->named_parameters()["fc1_weight_again"].is_same(model->fc1->weight));
    }
  }
}

TEST(EngineStages, TiedParametersAreCountedOnce) {
  auto model = Quirky();
  auto engine = initialize(model.ptr(), config_from(config_json(0, 1)));
  const int64_t unique = 8 * 16 + 16 + 16 + 1 + 5;
  EXPECT_EQ(engine->memory().stage.params16, unique * 4);
}

TEST(EngineStages, Stage3FreesUnitParametersBetweenUses) {
  auto model = Mlp();
  InitOptions init;
  init.gather_units = {model->fc1.ptr()};
  auto engine = initialize(model.ptr(), config_from(config_json(3, 1)), init);
  const auto storage = [](const torch::Tensor& t) { return t.storage().nbytes(); };
  EXPECT_EQ(storage(model->fc1->weight), 0u) << "sharded at rest";
  // A released parameter is a 0-element tensor, as DeepSpeed's: a read between steps finds nothing, not freed memory.
  EXPECT_EQ(model->fc1->weight.numel(), 0);
  EXPECT_EQ(model->fc1->weight.sum().item<float>(), 0.0f);
  auto [x_host, y_host] = regression_data(16);
  const auto x = x_host.to(test_device()), y = y_host.to(test_device());
  size_t during = 0;
  std::vector<int64_t> shape_during;
  auto loss = engine->forward([&] {
    auto h = engine->run_unit(*model->fc1, [&] {
      auto out = model->fc1->forward(x);
      during = storage(model->fc1->weight);
      shape_during = model->fc1->weight.sizes().vec();
      return out;
    });
    return torch::mse_loss(model->fc2->forward(torch::tanh(h)), y);
  });
  EXPECT_EQ(during, (8 * 16 + 16) * sizeof(float)) << "the unit's whole group is gathered while it runs";
  EXPECT_EQ(shape_during, (std::vector<int64_t>{16, 8}));
  engine->backward(loss);
  engine->step();
  EXPECT_EQ(storage(model->fc1->weight), 0u) << "released after its backward";
  EXPECT_EQ(storage(model->fc2->weight), 0u) << "the root group too";
  EXPECT_EQ(model->fc1->weight.numel(), 0);
  EXPECT_EQ(model->fc2->weight.numel(), 0);
}

TEST(EngineStages, Stage3ErrorsNameTheMisuse) {
  auto model = Mlp();
  auto other = torch::nn::Linear(2, 2);
  InitOptions bad;
  bad.gather_units = {other.ptr()};
  EXPECT_THROW(initialize(model.ptr(), config_from(config_json(3, 1)), bad), std::invalid_argument);

  InitOptions init;
  init.gather_units = {model->fc1.ptr()};
  auto engine = initialize(model.ptr(), config_from(config_json(3, 1)), init);
  auto [x, y] = regression_data(16);
  // Backward without engine->forward, a unit run outside engine->forward, a module that is not a unit.
  EXPECT_THROW(engine->backward(torch::ones({}, torch::requires_grad())), std::logic_error);
  EXPECT_THROW(engine->run_unit(*model->fc1, [&] { return x; }), std::logic_error);
  EXPECT_THROW(engine->forward([&] { return engine->run_unit(*model->fc2, [&] { return x; }).sum(); }),
               std::invalid_argument);
}

// Two units and a head; `built` is called with each unit as soon as it exists (partitioned construction).
struct StackImpl : torch::nn::Module {
  explicit StackImpl(const std::function<void(std::shared_ptr<torch::nn::Module>)>& built = {}) {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    if (built) built(fc1.ptr());
    fc2 = register_module("fc2", torch::nn::Linear(16, 16));
    if (built) built(fc2.ptr());
    out = register_module("out", torch::nn::Linear(16, 1));
    // Partitioned units are already on the device their PartitionedInit names; only the head moves.
    if (built) {
      out->to(test_device());
    } else {
      to(test_device());
    }
  }
  torch::Tensor loss(Engine& engine, const torch::Tensor& x, const torch::Tensor& y) {
    const auto device = out->weight.device();
    auto h = engine.run_unit(*fc1, [&] { return torch::tanh(fc1->forward(x.to(device))); });
    h = engine.run_unit(*fc2, [&] { return torch::tanh(fc2->forward(h)); });
    return torch::mse_loss(out->forward(h), y.to(device));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};
TORCH_MODULE(Stack);

std::shared_ptr<PartitionedInit> partitioned_init(const Config& config) {
  return std::make_shared<PartitionedInit>(config, init_comm(DistEnv{}), test_device());
}

std::function<void(std::shared_ptr<torch::nn::Module>)> partition_into(const std::shared_ptr<PartitionedInit>& init) {
  return [init](std::shared_ptr<torch::nn::Module> unit) { init->partition(unit); };
}

// Trains `model` under `options` and `config` on `rows` rows of regression data, 8 a micro-step, and returns its
// parameters as the engine holds them (gathered, under ZeRO-3).
std::map<std::string, torch::Tensor> train_stack(Stack& model, const Config& config, InitOptions options,
                                                 int64_t rows) {
  auto engine = initialize(model.ptr(), config, std::move(options));
  auto [x, y] = regression_data(rows);
  for (int64_t row = 0; row < x.size(0); row += 8) {
    engine->backward(engine->forward([&] { return model->loss(*engine, x.narrow(0, row, 8), y.narrow(0, row, 8)); }));
    engine->step();
  }
  std::map<std::string, torch::Tensor> out;
  engine->visit_parameters([&](const std::string& name, const torch::Tensor& p) { out[name] = p.detach().clone(); });
  return out;
}

TEST(EngineStages, Stage3BuiltPartitionedTrainsExactlyAsBuiltWhole) {
  const auto config = config_from(config_json(3, 2));
  auto train = [&](bool partitioned) {
    InitOptions options;
    torch::manual_seed(3);
    Stack model{nullptr};
    if (partitioned) {
      options.partitioned = partitioned_init(config);
      model = Stack(partition_into(options.partitioned));
      // Built partitioned: the units hold no memory from the moment they exist; the head is whole until initialize.
      EXPECT_EQ(model->fc1->weight.storage().nbytes(), 0u);
      EXPECT_EQ(model->fc2->bias.storage().nbytes(), 0u);
      EXPECT_GT(model->out->weight.storage().nbytes(), 0u);
      EXPECT_EQ(options.partitioned->units().size(), 2u);
    } else {
      model = Stack();
      options.gather_units = {model->fc1.ptr(), model->fc2.ptr()};
    }
    return train_stack(model, config, options, 4 * 16);
  };
  const auto whole = train(false);
  const auto partitioned = train(true);
  ASSERT_EQ(partitioned.size(), whole.size());
  for (const auto& [name, value] : whole) {
    ASSERT_TRUE(partitioned.count(name)) << name;
    EXPECT_TRUE(torch::equal(partitioned.at(name), value)) << name;
  }
}

// The parameters a model built (partitioned or whole, seed 3) holds after `steps` steps under `json`.
std::map<std::string, torch::Tensor> stack_parameters(const std::string& json, bool partitioned, int steps,
                                                      bool fc1_only = false) {
  const auto config = config_from(json);
  torch::manual_seed(3);
  InitOptions options;
  Stack model{nullptr};
  if (partitioned) {
    options.partitioned = partitioned_init(config_from(config_json(3, 1)));  // threshold 0: fc1 and fc2 cut down
    model = Stack(partition_into(options.partitioned));
  } else {
    model = Stack();
  }
  options.gather_units = {model->fc1.ptr()};
  if (!fc1_only) options.gather_units.push_back(model->fc2.ptr());
  return train_stack(model, config, options, steps * 8);
}

void expect_same(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, value] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(torch::equal(b.at(name), value)) << name;
  }
}

TEST(EngineStages, Stage3BuiltPartitionedThenRegroupedTrainsAsBuiltWhole) {
  // A persistence threshold that keeps fc1 and fc2 whole, while they were partitioned under threshold 0: their units
  // are gathered back at initialize and trained as persistent parameters.
  auto kept_whole = config_json(3, 1);
  const std::string key = R"("stage3_param_persistence_threshold": 0)";
  kept_whole.replace(kept_whole.find(key), key.size(), R"("stage3_param_persistence_threshold": 1000)");
  expect_same(stack_parameters(kept_whole, false, 3), stack_parameters(kept_whole, true, 3));
  // Gather units that leave fc2 out: its parameters join the root group with the head's.
  expect_same(stack_parameters(config_json(3, 1), false, 0, true),
              stack_parameters(config_json(3, 1), true, 0, true));
}

// zero_optimization.stage3_model_persistence_threshold (DeepSpeed's model_persistence_threshold) bounds the elements
// the persistent parameters hold together: in order, a small parameter persists only while the total stays within
// it; one that would pass it is partitioned, and later, smaller ones may still persist. Quirky's parameters in
// named_parameters() order (a module's own before its children's, as in PyTorch): unused 5, fc1_weight_again 128 (fc1's
// weight, counted once), fc1.bias 16, fc2.weight 16, fc2.bias 1.
TEST(EngineStages, Stage3ModelPersistenceThresholdBoundsThePersistentParameters) {
  auto persistent_elements = [](const std::string& model_threshold) {
    auto json = config_json(3, 1);
    const std::string key = R"("stage3_param_persistence_threshold": 0)";
    json.replace(json.find(key), key.size(), R"("stage3_param_persistence_threshold": 1000)" + model_threshold);
    torch::manual_seed(0);
    Quirky model;
    auto engine = initialize(model.ptr(), config_from(json));
    return engine->memory_breakdown().states.stage.persistent / static_cast<int64_t>(sizeof(float));
  };
  EXPECT_EQ(persistent_elements(""), 166);
  EXPECT_EQ(persistent_elements(R"(, "stage3_model_persistence_threshold": 40)"), 5 + 16 + 16 + 1);
  EXPECT_EQ(persistent_elements(R"(, "stage3_model_persistence_threshold": 21)"), 5 + 16);  // reached exactly
  EXPECT_EQ(persistent_elements(R"(, "model_persistence_threshold": 20)"), 5 + 1);  // DeepSpeed's other name
  EXPECT_EQ(persistent_elements(R"(, "stage3_model_persistence_threshold": 0)"), 0);
}

TEST(EngineStages, Stage3BuiltPartitionedErrorsNameTheMismatch) {
  const auto config = config_from(config_json(3, 1));
  // Not stage 3.
  EXPECT_THROW(PartitionedInit(config_from(config_json(2, 1)), init_comm(DistEnv{})), ConfigError);
  // Built in bf16 (the bf16 config's compute dtype), trained in fp32.
  {
    auto bf16 = config_json(3, 1);
    bf16.insert(1, R"("bf16": {"enabled": true}, )");
    auto init = partitioned_init(config_from(bf16));
    Stack model(partition_into(init));
    InitOptions options;
    options.partitioned = init;
    EXPECT_THROW(initialize(model.ptr(), config, options), ConfigError);
  }
  // Units handed to the engine cannot be partitioned again.
  {
    auto init = partitioned_init(config);
    Stack model(partition_into(init));
    InitOptions options;
    options.partitioned = init;
    auto engine = initialize(model.ptr(), config, options);
    EXPECT_THROW(init->partition(torch::nn::Linear(2, 2).ptr()), std::logic_error);
  }
}

TEST(EngineStages, Stage2RejectsBackwardOutsideTheEngine) {
  auto model = Mlp();
  auto engine = initialize(model.ptr(), config_from(config_json(2, 1)));
  auto [x, y] = regression_data(16);
  EXPECT_THROW(model->loss(x, y).backward(), std::logic_error);
}

}  // namespace
}  // namespace dscpp::testing
