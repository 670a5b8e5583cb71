// Small models and data for engine tests: fast, deterministic, and (for fp16) elementwise, so the loss scaler's
// arithmetic is checked without a matmul's rounding in the way. Models live on the test device (DSCPP_TEST_DEVICE)
// and take their inputs there.
#pragma once

#include <torch/torch.h>

#include <string>

#include "dscpp/config/config.h"
#include "../common/test_device.h"

namespace dscpp::testing {

// y = W2 tanh(W1 x + b1) + b2, MSE against a target.
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 1));
    to(test_device());
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    auto out = fc2->forward(torch::tanh(fc1->forward(x.to(fc1->weight.device(), fc1->weight.scalar_type()))));
    return torch::mse_loss(out.to(torch::kFloat32), y.to(out.device()));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

// Elementwise only (no matmul), so it runs in fp16 on CPU: loss = mean((w ⊙ x + b − y)²).
struct ElementwiseImpl : torch::nn::Module {
  explicit ElementwiseImpl(int64_t n = 32) {
    w = register_parameter("w", torch::linspace(0.5, 1.5, n));
    b = register_parameter("b", torch::zeros({n}));
    to(test_device());
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    auto out = w * x.to(w.device(), w.scalar_type()) + b;
    return (out.to(torch::kFloat32) - y.to(out.device())).pow(2).mean();
  }
  torch::Tensor w, b;
};
TORCH_MODULE(Elementwise);

// A fixed regression data set: `n` samples of 8 features.
inline std::pair<torch::Tensor, torch::Tensor> regression_data(int64_t n, uint64_t seed = 7) {
  torch::manual_seed(seed);
  auto x = torch::randn({n, 8});
  auto y = (x.narrow(1, 0, 1) * 0.7 - x.narrow(1, 3, 1) * 0.2).sin();
  return {x, y};
}

inline Config config_from(const std::string& json, int world_size = 1) {
  ConfigOptions options;
  options.world_size = world_size;
  options.warn = [](const std::string&) {};
  return Config::from_string(json, options);
}

}  // namespace dscpp::testing
