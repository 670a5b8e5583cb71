// The ZeRO stages on one process, through the engine: what every stage must agree on, and the hazards of taking
// gradients from hooks (stage 2): unused parameters, tied parameters, backward outside the engine.
#include <gtest/gtest.h>

#include "dscpp/dscpp.h"
#include "test_models.h"

namespace dscpp::testing {
namespace {

// An MLP with a parameter the loss never uses and a weight registered under two names.
struct QuirkyImpl : torch::nn::Module {
  QuirkyImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
    unused = register_parameter("unused", torch::ones({5}));
    register_parameter("fc1_weight_again", fc1->weight);  // tied: the same tensor twice
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    return torch::mse_loss(fc2->forward(torch::tanh(fc1->forward(x))), y);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor unused;
};
TORCH_MODULE(Quirky);

std::string config_json(int stage, int grad_accum) {
  return R"({"train_batch_size": 16, "gradient_accumulation_steps": )" + std::to_string(grad_accum) +
         R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
         R"(, "reduce_bucket_size": 50, "overlap_comm": true},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}, "gradient_clipping": 0.5})";
}

std::vector<torch::Tensor> train(int stage, int grad_accum, Quirky& model) {
  torch::manual_seed(0);
  model = Quirky();
  auto engine = initialize(model.ptr(), config_from(config_json(stage, grad_accum)));
  auto [x, y] = regression_data(5 * 16);
  const int64_t micro = 16 / grad_accum;
  for (int64_t row = 0; row < x.size(0); row += micro) {
    engine->backward(model->loss(x.narrow(0, row, micro), y.narrow(0, row, micro)));
    engine->step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(EngineStages, EveryStageMatchesStage0WithUnusedAndTiedParameters) {
  Quirky reference_model{nullptr};
  const auto reference = train(0, 1, reference_model);
  for (int stage : {0, 1, 2}) {
    for (int gas : {1, 4}) {
      Quirky model{nullptr};
      const auto params = train(stage, gas, model);
      ASSERT_EQ(params.size(), reference.size());
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(torch::allclose(params[i], reference[i], 1e-5, 1e-6)) << "stage " << stage << " gas " << gas << " param " << i;
      }
      // The unused parameter is only decayed (AdamW), never moved by a gradient.
      EXPECT_TRUE(torch::allclose(model->unused, torch::full({5}, std::pow(1 - 0.01 * 0.1, 5))));
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

TEST(EngineStages, Stage2RejectsBackwardOutsideTheEngine) {
  auto model = Mlp();
  auto engine = initialize(model.ptr(), config_from(config_json(2, 1)));
  auto [x, y] = regression_data(16);
  EXPECT_THROW(model->loss(x, y).backward(), std::logic_error);
}

}  // namespace
}  // namespace dscpp::testing
