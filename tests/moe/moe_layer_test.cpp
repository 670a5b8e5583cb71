// The MoE layer: in one process against a token-by-token reference (output and every gradient), and over real
// processes (the binary spawns itself with --worker as each rank) with ep_size 2 against the same layer with every
// expert on one rank: the same outputs, aux loss and counts, and expert gradients that are the ranks' sums.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "../common/multiprocess.h"
#include "dscpp/comm/comm.h"
#include "dscpp/moe/expert_groups.h"
#include "dscpp/moe/moe_layer.h"
#include "test_expert.h"

namespace dscpp::testing {
namespace {

using moe::MoE;
using moe::MoEOptions;

constexpr int64_t kHidden = 8;

// Not Cloneable: the layer cannot copy it.
struct PlainExpertImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x) { return x; }
};
TORCH_MODULE(PlainExpert);

MoEOptions options(int64_t experts, int ep, int k, bool drop, bool residual = false) {
  MoEOptions o;
  o.hidden_size = kHidden;
  o.num_experts = experts;
  o.ep_size = ep;
  o.gate.k = k;
  o.gate.drop_tokens = drop;
  o.gate.use_rts = false;
  o.gate.top2_2nd_expert_sampling = false;
  o.gate.min_capacity = 0;
  o.use_residual = residual;
  return o;
}

// Experts of their own (give_experts_own_values), the gate and the residual part fixed values, so the routing and
// each expert matter, and two layouts of one layer hold the same values.
void set_values(moe::MoEImpl& layer) {
  give_experts_own_values(layer);
  torch::NoGradGuard no_grad;
  torch::manual_seed(7);
  layer.wg->weight.copy_(torch::randn_like(layer.wg->weight));
  if (layer.options().use_residual) {
    for (auto& p : layer.mlp.ptr()->parameters()) p.copy_(torch::randn_like(p) * 0.5);
    for (auto& p : layer.coefficient->parameters()) p.copy_(torch::randn_like(p));
  }
}

torch::Tensor tokens(uint64_t seed, int64_t batch = 4, int64_t seq = 6) {
  torch::manual_seed(seed);
  return torch::randn({batch, seq, kHidden});
}

// Σ over each token's kept choices of weight · expert(token), one token at a time.
torch::Tensor reference_forward(moe::MoEImpl& layer, const torch::Tensor& x) {
  const auto flat = x.reshape({-1, kHidden});
  const auto routing = moe::route(torch::linear(flat, layer.wg->weight), layer.options().gate, true);
  std::vector<torch::Tensor> rows;
  for (int64_t s = 0; s < flat.size(0); ++s) {
    auto row = torch::zeros({kHidden});
    for (int64_t c = 0; c < routing.expert.size(0); ++c) {
      if (!routing.kept[c][s].item<bool>()) continue;
      const auto e = routing.expert[c][s].item<int64_t>();
      row = row + routing.weight[c][s] * layer.experts[e].forward<torch::Tensor>(flat[s].unsqueeze(0)).squeeze(0);
    }
    rows.push_back(row);
  }
  auto out = torch::stack(rows).view(x.sizes());
  if (layer.options().use_residual) {
    const auto coef = torch::softmax(layer.coefficient->forward(x), -1);
    out = out * coef.narrow(-1, 0, 1) + layer.mlp.forward<torch::Tensor>(x) * coef.narrow(-1, 1, 1);
  }
  return out;
}

std::map<std::string, torch::Tensor> grads_after(moe::MoEImpl& layer, const torch::Tensor& out) {
  layer.zero_grad();
  torch::manual_seed(3);
  (out * torch::randn_like(out)).sum().backward();
  std::map<std::string, torch::Tensor> grads;
  for (const auto& p : layer.named_parameters()) {
    grads[p.key()] = p.value().grad().defined() ? p.value().grad().clone() : torch::zeros_like(p.value());
  }
  return grads;
}

class OneProcessLayer : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(OneProcessLayer, OutputAndGradientsEqualTheTokenByTokenReference) {
  const auto [k, drop, residual] = GetParam();
  MoE layer(options(4, 1, k, drop, residual), torch::nn::AnyModule(Expert(kHidden)));
  set_values(*layer);
  const auto x = tokens(1);
  const auto result = layer->forward(x);
  const auto expected = reference_forward(*layer, x);
  EXPECT_TRUE(torch::allclose(result.output, expected, 1e-5, 1e-6)) << (result.output - expected).abs().max();
  const auto got = grads_after(*layer, result.output);
  const auto want = grads_after(*layer, reference_forward(*layer, x));
  // A weight's gradient sums over the tokens routed to it, in the layer by one matrix product and in the reference
  // token by token: fp32 sums in two orders, so the bound scales with the gradient (torch 2.11's MKL sgemm differed
  // by up to 1.6e-6 here).
  for (const auto& [name, grad] : want) {
    const double scale = std::max(1.0, grad.abs().max().item<double>());
    EXPECT_TRUE(torch::allclose(got.at(name), grad, 1e-5, 1e-5 * scale))
        << name << ": " << (got.at(name) - grad).abs().max() << " of " << scale;
  }
  EXPECT_GT(got.at("deepspeed_moe.gate.wg.weight").abs().sum().item<double>(), 0) << "no gradient reached the gate";
  EXPECT_EQ(result.exp_counts.sum().item<int64_t>(), 24 * k);
}

INSTANTIATE_TEST_SUITE_P(TopKDroppingResidual, OneProcessLayer,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(true, false),
                                            ::testing::Values(false, true)),
                         [](const auto& info) {
                           return "k" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_drop" : "_nodrop") +
                                  (std::get<2>(info.param) ? "_residual" : "");
                         });

TEST(MoELayer, NamesAreDeepSpeedsWithGlobalExpertIndices) {
  MoE layer(options(4, 1, 1, true, true), torch::nn::AnyModule(Expert(kHidden)));
  std::vector<std::string> names;
  for (const auto& p : layer->named_parameters()) names.push_back(p.key());
  const std::vector<std::string> expected = {
      "deepspeed_moe.gate.wg.weight",
      "deepspeed_moe.experts.deepspeed_experts.0.fc1.weight", "deepspeed_moe.experts.deepspeed_experts.0.fc1.bias",
      "deepspeed_moe.experts.deepspeed_experts.0.fc2.weight", "deepspeed_moe.experts.deepspeed_experts.0.fc2.bias",
      "deepspeed_moe.experts.deepspeed_experts.1.fc1.weight", "deepspeed_moe.experts.deepspeed_experts.1.fc1.bias",
      "deepspeed_moe.experts.deepspeed_experts.1.fc2.weight", "deepspeed_moe.experts.deepspeed_experts.1.fc2.bias",
      "deepspeed_moe.experts.deepspeed_experts.2.fc1.weight", "deepspeed_moe.experts.deepspeed_experts.2.fc1.bias",
      "deepspeed_moe.experts.deepspeed_experts.2.fc2.weight", "deepspeed_moe.experts.deepspeed_experts.2.fc2.bias",
      "deepspeed_moe.experts.deepspeed_experts.3.fc1.weight", "deepspeed_moe.experts.deepspeed_experts.3.fc1.bias",
      "deepspeed_moe.experts.deepspeed_experts.3.fc2.weight", "deepspeed_moe.experts.deepspeed_experts.3.fc2.bias",
      "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias",
      "coefficient.weight", "coefficient.bias"};
  EXPECT_EQ(names, expected);
  // The experts are what expert_parameter_names finds, under the model's own prefix.
  auto model = std::make_shared<torch::nn::Module>();
  model->register_module("moe", layer);
  const auto experts = moe::expert_parameter_names(*model);
  ASSERT_EQ(experts.size(), 16u);
  EXPECT_EQ(experts.front(), "moe.deepspeed_moe.experts.deepspeed_experts.0.fc1.weight");
  // Deep copies: the same values at first, separate tensors.
  EXPECT_TRUE(torch::equal(layer->experts[0].ptr()->parameters()[0], layer->experts[3].ptr()->parameters()[0]));
  EXPECT_FALSE(layer->experts[0].ptr()->parameters()[0].is_same(layer->experts[3].ptr()->parameters()[0]));
}

TEST(MoELayer, BadConfigurationsAreNamedWithTheirNumbers) {
  auto expect_error = [](const std::function<void()>& build, const std::string& message) {
    try {
      build();
      ADD_FAILURE() << "accepted: " << message;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  const torch::nn::AnyModule expert(Expert{kHidden});
  expect_error([&] { MoE(options(6, 4, 1, true), expert); }, "MoE num_experts 6 is not divisible by ep_size 4");
  expect_error([&] { MoE(options(4, 2, 1, true), expert); }, "MoE ep_size is 2 but the expert-parallel group has 1 ranks");
  expect_error([&] { MoE(options(1, 1, 2, true), expert); }, "MoE num_experts 1 is fewer than k 2");
  expect_error([&] { MoE(options(4, 1, 3, true), expert); }, "MoE k is 3; it must be 1 or 2");
  auto zero_capacity = options(4, 1, 1, true);
  zero_capacity.gate.capacity_factor = 0;
  expect_error([&] { MoE(zero_capacity, expert); }, "MoE capacity_factor is 0; it must be > 0");
  expect_error([&] { MoE(options(4, 1, 1, true), torch::nn::AnyModule(PlainExpert())); },
               "MoE: the expert module cannot be deep-copied for each expert; make it a torch::nn::Cloneable");
  expect_error([] { moe::expert_data_parallel_ranks(4, 3); },
               "MoE ep_size 3 must divide the data-parallel size 4");
}

TEST(MoELayer, ExpertGroupsAreDeepSpeeds) {
  // DeepSpeed's example: 16 ranks, ep 2 → expert-parallel [0,1], [2,3], …; expert-data-parallel evens and odds.
  const auto ep = moe::expert_parallel_ranks(16, 2);
  ASSERT_EQ(ep.size(), 8u);
  EXPECT_EQ(ep[1], (std::vector<int>{2, 3}));
  const auto edp = moe::expert_data_parallel_ranks(16, 2);
  ASSERT_EQ(edp.size(), 2u);
  EXPECT_EQ(edp[0], (std::vector<int>{0, 2, 4, 6, 8, 10, 12, 14}));
  EXPECT_EQ(edp[1], (std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15}));
}

// --- over real processes ---

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

void check_close(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  check(a.sizes() == b.sizes() && torch::allclose(a, b, 1e-5, 1e-6),
        what + " differs: max |diff| " + (a.sizes() == b.sizes() ? std::to_string((a - b).abs().max().item<double>())
                                                                   : std::string("(shapes differ)")));
}

// Rank r's tokens through an ep_size-P layer (experts spread over the expert-parallel group) and through one layer
// with every expert: outputs, aux loss and counts equal; the gate's gradient equal; each local expert's gradient
// the sum over the expert-parallel group of the whole layer's gradient for it.
void compare_expert_parallel(const std::shared_ptr<Comm>& world, int ep, int k, bool drop) {
  const auto groups = moe::make_expert_groups(world, ep);
  const int64_t experts = 2 * ep;
  MoE spread(options(experts, ep, k, drop), torch::nn::AnyModule(Expert(kHidden)), groups.expert_parallel);
  MoE whole(options(experts, 1, k, drop), torch::nn::AnyModule(Expert(kHidden)));
  set_values(*spread);
  set_values(*whole);
  const auto x = tokens(10 + world->rank());
  const auto a = spread->forward(x);
  const auto b = whole->forward(x);
  const std::string where = "ep " + std::to_string(ep) + " k " + std::to_string(k) + (drop ? " drop" : " no drop") +
                            " rank " + std::to_string(world->rank());
  check_close(a.output, b.output, where + ": output");
  check_close(a.l_aux, b.l_aux, where + ": l_aux");
  check(torch::equal(a.exp_counts, b.exp_counts), where + ": exp_counts differ");
  auto ga = grads_after(*spread, a.output);
  auto gb = grads_after(*whole, b.output);
  check_close(ga.at("deepspeed_moe.gate.wg.weight"), gb.at("deepspeed_moe.gate.wg.weight"), where + ": gate gradient");
  for (auto& [name, grad] : gb) {
    if (name.find("deepspeed_experts") == std::string::npos) continue;
    groups.expert_parallel->all_reduce(grad).wait();  // every rank's tokens reach expert g on its owner only
    if (ga.count(name)) check_close(ga.at(name), grad, where + ": " + name);
  }
  // This rank holds its experts only: num_experts / ep_size of them.
  int64_t expert_params = 0, whole_params = 0;
  for (const auto& [name, p] : spread->expert_parameters()) expert_params += p.numel();
  for (const auto& [name, p] : whole->expert_parameters()) whole_params += p.numel();
  check(expert_params * ep == whole_params, where + ": holds " + std::to_string(expert_params) + " of " +
                                                std::to_string(whole_params) + " expert parameters");
  check(spread->first_local_expert() == groups.expert_parallel->rank() * 2, where + ": wrong local experts");
  world->barrier();
}

int worker(const std::string& scenario) {
  const int ep = scenario == "ep2dp2" ? 2 : std::stoi(scenario.substr(2));
  // One rendezvous per process: a second one on the same port could meet the first one's store.
  const auto world = init_comm(DistEnv::from_env(), CommBackend::kGloo);
  for (int k : {1, 2}) {
    for (bool drop : {true, false}) compare_expert_parallel(world, ep, k, drop);
  }
  return 0;
}

TEST(MoELayer, ExpertParallelRanksGiveTheOneRankLayer) {
  const std::string self = "/proc/" + std::to_string(::getpid()) + "/exe";
  for (const auto& [scenario, world] : std::vector<std::pair<std::string, int>>{{"ep2", 2}, {"ep2dp2", 4}}) {
    const auto ranks = run_ranks(world, self + " --worker " + scenario, "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=1");
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(ranks[r].code, 0) << scenario << " rank " << r << ": " << ranks[r].out << ranks[r].err;
    }
  }
}

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) { return dscpp::testing::worker_or_tests(argc, argv, dscpp::testing::worker); }
