// The expert the MoE tests deep-copy: a two-layer MLP, Cloneable as the layer requires.
#pragma once

#include <torch/torch.h>

#include "dscpp/moe/moe_layer.h"

namespace dscpp::testing {

class ExpertImpl : public torch::nn::Cloneable<ExpertImpl> {
 public:
  explicit ExpertImpl(int64_t hidden) : hidden_(hidden) { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(hidden_, 2 * hidden_));
    fc2 = register_module("fc2", torch::nn::Linear(2 * hidden_, hidden_));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::gelu(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};

 private:
  int64_t hidden_;
};
TORCH_MODULE(Expert);

// Deep copies start equal; gives global expert g values of its own (seeded by g), so that which expert a token
// meets matters from the first step, and two layouts of one layer hold the same experts.
inline void give_experts_own_values(moe::MoEImpl& layer) {
  torch::NoGradGuard no_grad;
  for (int64_t i = 0; i < layer.num_local_experts(); ++i) {
    torch::manual_seed(100 + layer.first_local_expert() + i);
    for (auto& p : layer.experts[i].ptr()->parameters()) p.copy_(torch::randn_like(p) * 0.5);
  }
}

}  // namespace dscpp::testing
