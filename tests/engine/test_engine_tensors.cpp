// The engine over a model's tensors (ModelTensors, the Python front end's way in) against the engine over the
// LibTorch module that owns them: the same steps must give the same weights bit for bit, at every ZeRO stage, with
// ZeRO-3's units given as lists of parameters.
#include <gtest/gtest.h>

#include "dscpp/dscpp.h"
#include "test_models.h"
#include "../common/subprocess.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>

namespace dscpp::testing {
namespace {

// Two blocks (ZeRO-3 units), a tied weight outside them, a frozen parameter and an integer buffer.
struct TwoBlocksImpl : torch::nn::Module {
  TwoBlocksImpl() {
    block0 = register_module("block0", torch::nn::Linear(8, 16));
    block1 = register_module("block1", torch::nn::Linear(16, 8));
    head = register_parameter("head", torch::randn({8}) * 0.1);
    register_parameter("head_again", head);  // tied: one tensor under two names
    frozen = register_parameter("frozen", torch::full({8}, 0.5), /*requires_grad=*/false);
    steps = register_buffer("steps", torch::zeros({1}, torch::kInt64));
    to(test_device());
  }
  // `unit(i, f)` runs block i's forward (through the engine's run_unit, or directly).
  template <typename RunUnit>
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y, RunUnit unit) {
    const auto device = head.device();
    auto h = unit(0, [&] { return torch::tanh(block0->forward(x.to(device))); });
    h = unit(1, [&] { return block1->forward(h); });
    return torch::mse_loss(((h + frozen) * head).sum(1, true), y.to(device));
  }
  torch::nn::Linear block0{nullptr}, block1{nullptr};
  torch::Tensor head, frozen, steps;
};
TORCH_MODULE(TwoBlocks);

std::string config_json(int stage) {
  return R"({"train_batch_size": 16, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": )" +
         std::to_string(stage) + R"(, "reduce_bucket_size": 50, "stage3_param_persistence_threshold": 0},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}, "gradient_clipping": 0.5})";
}

std::map<std::string, torch::Tensor> train(int stage, bool as_tensors) {
  torch::manual_seed(0);
  auto model = TwoBlocks();
  const auto config = config_from(config_json(stage));
  std::unique_ptr<Engine> engine;
  std::vector<std::shared_ptr<torch::nn::Module>> units = {model->block0.ptr(), model->block1.ptr()};
  if (as_tensors) {
    engine = initialize(model_tensors(*model, units), config);
  } else {
    InitOptions options;
    options.gather_units = units;
    engine = initialize(model.ptr(), config, options);
  }
  auto [x, y] = regression_data(4 * 16);
  for (int64_t row = 0; row < x.size(0); row += 8) {
    auto loss = engine->forward([&] {
      return model->loss(x.narrow(0, row, 8), y.narrow(0, row, 8), [&](int i, const auto& f) {
        return as_tensors ? engine->run_unit(i, f) : engine->run_unit(i == 0 ? *model->block0 : *model->block1, f);
      });
    });
    engine->backward(loss);
    engine->step();
  }
  std::map<std::string, torch::Tensor> out;
  engine->visit_parameters([&](const std::string& name, const torch::Tensor& p) { out[name] = p.detach().clone(); });
  return out;
}

TEST(EngineTensors, TrainsBitwiseAsTheModuleItCameFromAtEveryStage) {
  for (int stage : {0, 1, 2, 3}) {
    const auto from_module = train(stage, false);
    const auto from_tensors = train(stage, true);
    ASSERT_EQ(from_module.size(), 5u) << "stage " << stage;  // block0 w/b, block1 w/b, head (tied once, frozen out)
    ASSERT_EQ(from_tensors.size(), from_module.size()) << "stage " << stage;
    for (const auto& [name, value] : from_module) {
      ASSERT_TRUE(from_tensors.count(name)) << name;
      EXPECT_TRUE(torch::equal(from_tensors.at(name), value)) << "stage " << stage << " " << name;
    }
  }
}

TEST(EngineTensors, ModelTensorsTakeATiedParameterOnceAndListBuffersAndUnits) {
  auto model = TwoBlocks();
  const auto tensors = model_tensors(*model, {model->block1.ptr()});
  std::vector<std::string> names;
  for (const auto& p : tensors.params) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"head", "frozen", "block0.weight", "block0.bias", "block1.weight",
                                             "block1.bias"}));
  ASSERT_EQ(tensors.buffers.size(), 1u);
  EXPECT_EQ(tensors.buffers[0].name, "steps");
  ASSERT_EQ(tensors.units.size(), 1u);
  EXPECT_EQ(tensors.units[0].name, "block1");
  ASSERT_EQ(tensors.units[0].params.size(), 2u);
  EXPECT_TRUE(tensors.units[0].params[0].is_same(model->block1->weight));
}

TEST(EngineTensors, AUnitOutsideTheModelIsNamedByIndex) {
  auto model = TwoBlocks();
  auto stranger = torch::nn::Linear(2, 2);
  try {
    model_tensors(*model, {model->block0.ptr(), stranger.ptr()});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("gather_units[1] is not a submodule"), std::string::npos) << e.what();
  }
}

TEST(EngineTensors, CastChangesFloatingTensorsInPlaceAndLeavesIntegerBuffers) {
  auto model = TwoBlocks();
  const auto* weight_impl = model->block0->weight.unsafeGetTensorImpl();
  auto tensors = model_tensors(*model, {});
  cast_floating(tensors, torch::kBFloat16);
  EXPECT_EQ(model->block0->weight.scalar_type(), torch::kBFloat16);  // the module's own tensor object
  EXPECT_EQ(model->block0->weight.unsafeGetTensorImpl(), weight_impl);
  EXPECT_EQ(model->frozen.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(model->steps.scalar_type(), torch::kInt64);
}

TEST(EngineTensors, ModuleOptionsAreRefusedForTensors) {
  auto model = TwoBlocks();
  InitOptions options;
  options.gather_units = {model->block0.ptr()};
  try {
    initialize(model_tensors(*model, {}), config_from(config_json(3)), options);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("ModelTensors::units"), std::string::npos) << e.what();
  }
}

// A non-persistent buffer (Python's register_buffer(persistent=False)) stays out of the checkpoint's module state;
// naming something that is not a buffer is an error naming it.
TEST(EngineTensors, NonPersistentBuffersStayOutOfCheckpoints) {
  const auto dir = dscpp::testing::temp_dir("non_persistent");
  auto model = TwoBlocks();
  auto tensors = model_tensors(*model, {});
  tensors.non_persistent_buffers = {"steps"};
  auto engine = initialize(tensors, config_from(config_json(1)));
  engine->save_checkpoint(dir.string(), "t");
  std::set<std::string> saved;
  for (const auto& e : Manifest::read((dir / "t").string()).module_state) saved.insert(e.name);
  EXPECT_EQ(saved, std::set<std::string>{"frozen"});
  std::filesystem::remove_all(dir);

  auto other = TwoBlocks();
  auto wrong = model_tensors(*other, {});
  wrong.non_persistent_buffers = {"head"};
  try {
    initialize(wrong, config_from(config_json(1)));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("non_persistent_buffers names 'head'"), std::string::npos) << e.what();
  }
}

TEST(EngineTensors, ZeroThreeRefusesAnUnknownUnitIndex) {
  auto model = TwoBlocks();
  auto engine = initialize(model_tensors(*model, {model->block0.ptr()}), config_from(config_json(3)));
  engine->begin_forward();
  EXPECT_THROW(engine->run_unit(5, [] { return torch::zeros({1}); }), std::invalid_argument);
  engine->end_forward(false);
}

// InitOptions::untrained_params (DeepSpeed's optimizer over a subset of the trainable parameters): the named ones keep
// their values through training, the others train; a name that is not a trainable parameter is refused by name.
TEST(EngineTensors, UntrainedParametersKeepTheirValuesAndOthersTrain) {
  for (int stage : {0, 3}) {
    auto model = Mlp();
    const auto fc1_before = model->fc1->weight.detach().clone();
    const auto fc2_before = model->fc2->weight.detach().clone();
    InitOptions options;
    options.untrained_params = {"fc1.weight"};
    auto engine = initialize(model_tensors(*model, {}), config_from(R"({"train_batch_size": 4,
        "zero_optimization": {"stage": )" + std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"), options);
    auto [x, y] = regression_data(4);
    for (int step = 0; step < 2; ++step) {
      engine->backward(engine->forward([&] { return model->loss(x, y); }));
      engine->step();
    }
    std::map<std::string, torch::Tensor> trained;
    engine->visit_parameters([&](const std::string& name, const torch::Tensor& p) { trained[name] = p.detach().clone(); });
    EXPECT_EQ(trained.count("fc1.weight"), 0u) << "stage " << stage << ": an untrained parameter is not the optimizer's";
    EXPECT_TRUE(torch::equal(model->fc1->weight.detach().to(torch::kCPU), fc1_before.to(torch::kCPU))) << stage;
    ASSERT_EQ(trained.count("fc2.weight"), 1u);
    EXPECT_FALSE(torch::equal(trained.at("fc2.weight").to(torch::kCPU), fc2_before.to(torch::kCPU))) << stage;
  }
  auto model = Mlp();
  InitOptions options;
  options.untrained_params = {"fc9.weight"};
  try {
    initialize(model_tensors(*model, {}), config_from(R"({"train_batch_size": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"), options);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("untrained_params names 'fc9.weight'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dscpp::testing
