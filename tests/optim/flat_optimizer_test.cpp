// Flat optimizers against torch::optim on the same inputs (Lion and Lamb against their update rules written out):
// 10 steps with non-trivial gradients and a changing lr, relative error <= 1e-6 on the parameters.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/optim/flat_optimizer.h"

namespace dscpp {
namespace {

constexpr int64_t kNumel = 1031;
constexpr int kSteps = 10;

// A changing lr: the optimizer must use the one it is given at each step.
double lr_at(int step, double base) { return base * (1.0 + 0.3 * step) / (1.0 + 0.05 * step * step); }

// Deterministic gradients of mixed scale and sign (some elements tiny, so eps matters).
torch::Tensor grad_at(int step, int64_t numel) {
  torch::manual_seed(1000 + step);
  return torch::randn({numel}) * torch::linspace(1e-3, 2.0, numel) + 0.1 * std::sin(step);
}

torch::Tensor initial_param(int64_t numel) {
  torch::manual_seed(7);
  return torch::randn({numel});
}

double rel_error(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
}

std::unique_ptr<FlatOptimizer> make(std::string type, OptimizerOptions options, int64_t numel = kNumel) {
  return make_flat_optimizer(OptimizerConfig{std::move(type), std::move(options)}, numel, torch::TensorOptions());
}

// Runs ours and torch's side by side; `set_torch` sets torch's lr (and anything else) before its step k.
void expect_matches_torch(FlatOptimizer& ours, torch::optim::Optimizer& theirs, torch::Tensor& ref, double base_lr,
                          const std::function<void(int)>& before_step = {}, int64_t numel = kNumel,
                          int steps = kSteps) {
  torch::Tensor param = ref.detach().clone();
  for (int k = 0; k < steps; ++k) {
    if (before_step) before_step(k);
    const double lr = lr_at(k, base_lr);
    theirs.param_groups()[0].options().set_lr(lr);
    const torch::Tensor g = grad_at(k, numel);
    const torch::Tensor g_before = g.clone();
    ref.mutable_grad() = g.clone();
    theirs.step();
    ours.step(param, g, lr);
    EXPECT_TRUE(torch::equal(g, g_before)) << "the optimizer modified the gradient";
    ASSERT_LE(rel_error(param, ref.detach()), 1e-6) << "step " << k + 1;
  }
  // The run must have moved the parameters, or the comparison proves nothing.
  EXPECT_GT(rel_error(param, initial_param(numel)), 1e-3);
  EXPECT_EQ(ours.step_count(), steps);
}

torch::Tensor torch_param(int64_t numel = kNumel) { return initial_param(numel).requires_grad_(true); }

TEST(FlatAdam, L2ModeMatchesTorchAdam) {
  AdamOptions o;
  o.lr = 0.02;
  o.betas = {0.8, 0.95};
  o.eps = 1e-3;
  o.weight_decay = 0.1;
  o.adam_w_mode = false;
  auto ours = make("Adam", o);
  EXPECT_EQ(ours->name(), "Adam");
  torch::Tensor ref = torch_param();
  torch::optim::Adam theirs({ref}, torch::optim::AdamOptions(o.lr).betas({0.8, 0.95}).eps(1e-3).weight_decay(0.1));
  expect_matches_torch(*ours, theirs, ref, o.lr);
}

TEST(FlatAdam, DecoupledModeMatchesTorchAdamW) {
  AdamOptions o;  // adam_w_mode defaults to true, as in DeepSpeed
  o.lr = 0.02;
  o.betas = {0.85, 0.99};
  o.eps = 1e-4;
  o.weight_decay = 0.5;
  auto ours = make("Adam", o);
  torch::Tensor ref = torch_param();
  torch::optim::AdamW theirs({ref},
                             torch::optim::AdamWOptions(o.lr).betas({0.85, 0.99}).eps(1e-4).weight_decay(0.5));
  expect_matches_torch(*ours, theirs, ref, o.lr);
}

TEST(FlatAdam, AdamWTypeIsAlwaysDecoupled) {
  AdamOptions o;
  o.lr = 0.02;
  o.weight_decay = 0.5;
  o.adam_w_mode = false;  // DeepSpeed ignores this for "AdamW"
  auto ours = make("AdamW", o);
  EXPECT_EQ(ours->name(), "AdamW");
  torch::Tensor ref = torch_param();
  torch::optim::AdamW theirs({ref}, torch::optim::AdamWOptions(o.lr).weight_decay(0.5));
  expect_matches_torch(*ours, theirs, ref, o.lr);
}

TEST(FlatAdam, AmsgradMatchesTorchInBothModes) {
  for (const bool decoupled : {true, false}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam with L2");
    AdamOptions o;
    o.lr = 0.02;
    o.betas = {0.8, 0.9};  // a short second-moment memory, so v falls below its maximum within 10 steps
    o.eps = 1e-3;
    o.weight_decay = 0.1;
    o.adam_w_mode = decoupled;
    o.amsgrad = true;
    auto ours = make("Adam", o);
    EXPECT_EQ(ours->state_kinds(), (std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}));
    torch::Tensor ref = torch_param();
    std::unique_ptr<torch::optim::Optimizer> theirs;
    if (decoupled) {
      theirs = std::make_unique<torch::optim::AdamW>(
          std::vector<torch::Tensor>{ref},
          torch::optim::AdamWOptions(o.lr).betas({0.8, 0.9}).eps(1e-3).weight_decay(0.1).amsgrad(true));
    } else {
      theirs = std::make_unique<torch::optim::Adam>(
          std::vector<torch::Tensor>{ref},
          torch::optim::AdamOptions(o.lr).betas({0.8, 0.9}).eps(1e-3).weight_decay(0.1).amsgrad(true));
    }
    expect_matches_torch(*ours, *theirs, ref, o.lr);
    // The maximum took effect: plain Adam on the same inputs ends elsewhere.
    o.amsgrad = false;
    auto plain = make("Adam", o);
    torch::Tensor param = initial_param(kNumel);
    for (int k = 0; k < kSteps; ++k) plain->step(param, grad_at(k, kNumel), lr_at(k, o.lr));
    EXPECT_GT(rel_error(param, ref.detach()), 1e-4);
  }
}

TEST(FlatAdam, SpansSeveralChunks) {
  // Larger than the internal chunk (1 << 22 elements), so the chunked loop and its scratch reuse are exercised.
  const int64_t numel = (int64_t{1} << 22) + 1000;
  AdamOptions o;
  o.lr = 0.01;
  o.eps = 1e-3;
  o.weight_decay = 0.1;
  o.adam_w_mode = false;
  auto ours = make("Adam", o, numel);
  torch::Tensor ref = torch_param(numel);
  torch::optim::Adam theirs({ref}, torch::optim::AdamOptions(o.lr).eps(1e-3).weight_decay(0.1));
  expect_matches_torch(*ours, theirs, ref, o.lr, {}, numel, 3);
}

TEST(FlatAdam, WithoutBiasCorrectionOneStepByHand) {
  AdamOptions o;
  o.betas = {0.9, 0.99};
  o.eps = 1e-2;
  o.bias_correction = false;
  auto ours = make("Adam", o, 4);
  torch::Tensor p = torch::tensor({1.0f, -2.0f, 0.5f, 0.0f});
  const torch::Tensor g = torch::tensor({0.5f, -1.0f, 0.0f, 2.0f});
  ours->step(p, g, 0.1);
  // m = 0.1 g, v = 0.01 g^2, p -= 0.1 * m / (sqrt(v) + eps) = 0.1 * 0.1 g / (0.1 |g| + 0.01)
  const torch::Tensor expected = torch::tensor({1.0f - 0.1f * 0.05f / 0.06f, -2.0f + 0.1f * 0.1f / 0.11f, 0.5f,
                                                0.0f - 0.1f * 0.2f / 0.21f});
  EXPECT_LE(rel_error(p, expected), 1e-6);
}

TEST(FlatAdam, SetBetasChangesBothBetas) {
  AdamOptions o;
  o.lr = 0.02;
  o.eps = 1e-3;
  auto ours = make("Adam", o);
  torch::Tensor ref = torch_param();
  torch::optim::AdamW theirs({ref}, torch::optim::AdamWOptions(o.lr).eps(1e-3).weight_decay(0.0));
  expect_matches_torch(*ours, theirs, ref, o.lr, [&](int k) {
    const double beta1 = 0.9 - 0.02 * k;  // as OneCycle would, every step (with beta2 0.99, as DeepSpeed's)
    ours->set_betas(beta1, 0.99);
    static_cast<torch::optim::AdamWOptions&>(theirs.param_groups()[0].options()).betas({beta1, 0.99});
  });
}

TEST(FlatSgd, MatchesTorchSgdInEveryMode) {
  struct Case {
    double momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (const Case& c : {Case{0.0, 0.0, 0.0, false}, Case{0.0, 0.0, 0.05, false}, Case{0.9, 0.0, 0.0, false},
                        Case{0.9, 0.3, 0.05, false}, Case{0.9, 0.0, 0.05, true}, Case{0.8, 0.0, 0.0, true}}) {
    SCOPED_TRACE("momentum " + std::to_string(c.momentum) + " dampening " + std::to_string(c.dampening) +
                 " weight_decay " + std::to_string(c.weight_decay) + " nesterov " + std::to_string(c.nesterov));
    SgdOptions o;
    o.lr = 0.05;
    o.momentum = c.momentum;
    o.dampening = c.dampening;
    o.weight_decay = c.weight_decay;
    o.nesterov = c.nesterov;
    auto ours = make("SGD", o);
    EXPECT_EQ(ours->state_tensors().size(), c.momentum != 0.0 ? 1u : 0u);
    torch::Tensor ref = torch_param();
    torch::optim::SGD theirs({ref}, torch::optim::SGDOptions(o.lr)
                                        .momentum(c.momentum)
                                        .dampening(c.dampening)
                                        .weight_decay(c.weight_decay)
                                        .nesterov(c.nesterov));
    expect_matches_torch(*ours, theirs, ref, o.lr);
  }
}

// DeepSpeed's OneCycle writes "betas" into SGD's param groups, which torch's SGD never reads: its momentum stays.
TEST(FlatSgd, SetBetasLeavesMomentumAlone) {
  SgdOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  auto ours = make("SGD", o);
  torch::Tensor ref = torch_param();
  torch::optim::SGD theirs({ref}, torch::optim::SGDOptions(o.lr).momentum(0.9));
  expect_matches_torch(*ours, theirs, ref, o.lr, [&](int k) {
    if (k == 5) ours->set_betas(0.5, 0.99);
  });
}

TEST(FlatAdagrad, MatchesTorchAdagradWithLrDecay) {
  AdagradOptions o;
  o.lr = 0.1;
  o.lr_decay = 0.05;
  o.weight_decay = 0.02;
  o.initial_accumulator_value = 0.1;
  auto ours = make("Adagrad", o);
  torch::Tensor ref = torch_param();
  torch::optim::Adagrad theirs({ref}, torch::optim::AdagradOptions(o.lr)
                                          .lr_decay(0.05)
                                          .weight_decay(0.02)
                                          .initial_accumulator_value(0.1)
                                          .eps(1e-10));
  expect_matches_torch(*ours, theirs, ref, o.lr);
}

TEST(FlatLion, MatchesTheUpdateRuleWrittenOut) {
  LionOptions o;
  o.lr = 0.01;
  o.betas = {0.9, 0.99};
  o.weight_decay = 0.3;
  auto ours = make("Lion", o);
  torch::Tensor param = initial_param(kNumel);
  torch::Tensor ref = param.clone();
  torch::Tensor m = torch::zeros({kNumel});
  for (int k = 0; k < kSteps; ++k) {
    if (k == 5) ours->set_betas(0.8, 0.95);
    const double beta1 = k < 5 ? 0.9 : 0.8;
    const double beta2 = k < 5 ? 0.99 : 0.95;
    const double lr = lr_at(k, o.lr);
    const torch::Tensor g = grad_at(k, kNumel);
    ours->step(param, g, lr);
    // Reference: p *= 1 - lr*wd; p -= lr * sign(b1*m + (1-b1)*g); m = b2*m + (1-b2)*g
    ref = ref * (1.0 - lr * 0.3);
    ref = ref - lr * torch::sign(beta1 * m + (1.0 - beta1) * g);
    m = beta2 * m + (1.0 - beta2) * g;
    ASSERT_LE(rel_error(param, ref), 1e-6) << "step " << k + 1;
  }
  EXPECT_LE(rel_error(ours->state_tensors()[0].second, m), 1e-6);
  EXPECT_GT(rel_error(param, initial_param(kNumel)), 1e-3);
}

// DeepSpeed's FusedLamb kernel (csrc/lamb/fused_lamb_cuda_kernel.cu) written out, tensor by tensor: Adam's moments;
// update = m / (√v + ε) + wd·p (or m / √(v + ε)); ratio ‖p‖ / ‖update‖ clamped to [min_coeff, max_coeff], 1 where a
// norm is 0; p −= lr·√(1−β2^t)/(1−β1^t)·ratio·update (lr alone without bias correction).
struct LambReference {
  LambOptions o;
  std::vector<std::pair<int64_t, int64_t>> tensors;  // (begin, numel)
  std::vector<double> decay;                          // per tensor
  std::vector<std::optional<double>> group_lr;        // per tensor: its group's lr, or the step's
  torch::Tensor m = torch::zeros({kNumel}), v = torch::zeros({kNumel});
  int t = 0;

  void step(torch::Tensor& p, const torch::Tensor& g, double lr) {
    ++t;
    const double b1 = o.betas[0], b2 = o.betas[1];
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const double lr_i = group_lr[i].value_or(lr);
      const double step_size =
          o.bias_correction ? lr_i * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t)) : lr_i;
      const auto [begin, n] = tensors[i];
      auto pt = p.narrow(0, begin, n);
      const auto vt = v.narrow(0, begin, n);
      const auto denom = o.eps_inside_sqrt ? (vt + o.eps).sqrt() : vt.sqrt() + o.eps;
      const auto update = m.narrow(0, begin, n) / denom + decay[i] * pt;
      const double w = pt.norm().item<double>(), u = update.norm().item<double>();
      const double ratio = w != 0 && u != 0 ? std::clamp(w / u, o.min_coeff, o.max_coeff) : 1.0;
      pt.sub_(step_size * ratio * update);
    }
  }
};

// Four tensors (one of them zero, whose ratio is 1), the first in a group without weight decay and an lr of its own.
TEST(FlatLamb, FollowsFusedLambTensorByTensor) {
  const std::vector<std::pair<int64_t, int64_t>> tensors = {{0, 100}, {100, 400}, {500, 31}, {531, 500}};
  for (int variant = 0; variant < 3; ++variant) {
    LambOptions o;
    o.lr = 0.01;
    o.weight_decay = 0.05;
    o.bias_correction = variant != 1;
    o.eps_inside_sqrt = variant == 2;
    o.max_coeff = variant == 2 ? 0.5 : 10.0;  // the clamp at work
    auto ours = make("Lamb", o);
    PartitionTensors layout;
    for (size_t i = 0; i < tensors.size(); ++i) {
      layout.ranges.push_back({tensors[i].first, tensors[i].second, static_cast<int>(i)});
    }
    layout.tensor_count = static_cast<int>(tensors.size());
    ours->set_partition_tensors(layout);
    ours->set_groups({GroupSettings{0.0, 0.005}}, {GroupRange{0, 100, 0}});
    LambReference ref{o, tensors, {0.0, 0.05, 0.05, 0.05}, {0.005, std::nullopt, std::nullopt, std::nullopt}};
    auto p = initial_param(kNumel);
    p.narrow(0, 500, 31).zero_();  // ‖p‖ = 0 there
    auto q = p.clone();
    for (int k = 0; k < kSteps; ++k) {
      const auto g = grad_at(k, kNumel);
      const double lr = lr_at(k, o.lr);
      ours->step(p, g, lr);
      ref.step(q, g, lr);
      ASSERT_LE(rel_error(p, q), 1e-6) << "variant " << variant << " step " << k + 1;
    }
    EXPECT_GT(rel_error(p, initial_param(kNumel)), 1e-3);
    EXPECT_EQ(ours->step_count(), kSteps);
  }
}

// Each tensor moves by lr·ratio·update: its relative change is about lr whatever its scale, which is LAMB's point.
// A tensor 1000x larger moves 1000x more; without tensors given, the partition is one tensor.
TEST(FlatLamb, EachTensorMovesInProportionToItsNorm) {
  LambOptions o;
  o.lr = 0.01;
  o.bias_correction = false;
  o.max_coeff = 1e6;
  auto ours = make("Lamb", o, 200);
  PartitionTensors layout;
  layout.ranges = {{0, 100, 0}, {100, 100, 1}};
  layout.tensor_count = 2;
  ours->set_partition_tensors(layout);
  torch::manual_seed(3);
  auto p = torch::randn({200});
  p.narrow(0, 100, 100).mul_(1000);
  const auto before = p.clone();
  ours->step(p, torch::randn({200}), o.lr);
  const auto moved = (p - before);
  const double small = moved.narrow(0, 0, 100).norm().item<double>() / before.narrow(0, 0, 100).norm().item<double>();
  const double large =
      moved.narrow(0, 100, 100).norm().item<double>() / before.narrow(0, 100, 100).norm().item<double>();
  EXPECT_NEAR(small, o.lr, 1e-6);
  EXPECT_NEAR(large, o.lr, 1e-6);
  PartitionTensors bad;
  bad.ranges = {{0, 100, 0}, {50, 100, 1}};
  bad.tensor_count = 2;
  EXPECT_THROW(ours->set_partition_tensors(bad), std::invalid_argument);  // overlapping ranges
  EXPECT_THROW(ours->update(OptimizerSlice{p, p, {}, {}, std::nullopt}, 0.1), std::logic_error);
}

TEST(FlatOptimizer, StateNamesAndRestoreContinuesExactly) {
  AdamOptions o;
  o.lr = 0.02;
  auto a = make("Adam", o);
  std::vector<std::string> names;
  for (auto& [name, t] : a->state_tensors()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(make("Lion", LionOptions{})->state_tensors()[0].first, "exp_avg");
  EXPECT_EQ(make("Adagrad", AdagradOptions{})->state_tensors()[0].first, "sum");
  SgdOptions sgd;
  sgd.momentum = 0.9;
  EXPECT_EQ(make("SGD", sgd)->state_tensors()[0].first, "momentum_buffer");

  torch::Tensor pa = initial_param(kNumel);
  for (int k = 0; k < 3; ++k) a->step(pa, grad_at(k, kNumel), 0.02);
  // A "checkpoint": copy state and step count into a fresh optimizer, then both continue.
  auto b = make("Adam", o);
  for (size_t i = 0; i < 2; ++i) b->state_tensors()[i].second.copy_(a->state_tensors()[i].second);
  b->set_step_count(a->step_count());
  torch::Tensor pb = pa.clone();
  for (int k = 3; k < 6; ++k) {
    a->step(pa, grad_at(k, kNumel), 0.02);
    b->step(pb, grad_at(k, kNumel), 0.02);
  }
  EXPECT_TRUE(torch::equal(pa, pb));
}

TEST(FlatOptimizer, UnsupportedChoicesAreClearErrors) {
  auto error_of = [](std::string type, OptimizerOptions options) {
    try {
      make(std::move(type), std::move(options));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  LambOptions bad_coeffs;
  bad_coeffs.min_coeff = 20.0;  // above max_coeff
  EXPECT_NE(error_of("Lamb", bad_coeffs).find("optimizer.params.min_coeff must be in (0, max_coeff]"),
            std::string::npos);
  EXPECT_NE(error_of("OneBitLamb", OneBitLambOptions{}).find("needs the data-parallel comm"), std::string::npos);
  SgdOptions nesterov;
  nesterov.nesterov = true;
  EXPECT_NE(error_of("SGD", nesterov).find("optimizer.params.nesterov requires momentum > 0"), std::string::npos);
  AdamOptions bad_beta;
  bad_beta.betas = {1.0, 0.999};
  EXPECT_NE(error_of("Adam", bad_beta).find("optimizer.params.betas[0]"), std::string::npos);
  EXPECT_NE(error_of("SGD", AdamOptions{}).find("optimizer.type \"SGD\""), std::string::npos);
  EXPECT_EQ(error_of("adamw", AdamOptions{}), "no error");  // DeepSpeed matches names case-insensitively

  auto adam = make("Adam", AdamOptions{}, 8);
  torch::Tensor wrong = torch::zeros({9});
  EXPECT_THROW(adam->step(wrong, torch::zeros({9}), 1e-3), std::invalid_argument);
  torch::Tensor half = torch::zeros({8}, torch::kHalf);
  EXPECT_THROW(adam->step(half, torch::zeros({8}), 1e-3), std::invalid_argument);
}

// Stepping in slices with state the caller holds (what offload does, sub-group by sub-group) is the same
// arithmetic as step(): bitwise, for every optimizer, over uneven slices and 5 steps.
TEST(FlatOptimizer, SlicedUpdatesWithCallerStateEqualStep) {
  SgdOptions sgd;
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  sgd.weight_decay = 0.01;
  AdamOptions adam_l2;
  adam_l2.weight_decay = 0.1;
  adam_l2.adam_w_mode = false;
  AdagradOptions adagrad;
  adagrad.initial_accumulator_value = 0.3;
  adagrad.weight_decay = 0.05;
  const std::vector<std::pair<std::string, OptimizerOptions>> cases = {
      {"AdamW", AdamOptions{}}, {"Adam", adam_l2}, {"SGD", sgd}, {"Lion", LionOptions{}}, {"Adagrad", adagrad}};
  const std::vector<int64_t> cuts = {0, 1, 400, 777, kNumel};
  for (const auto& [type, options] : cases) {
    auto whole = make(type, options);
    auto sliced = make(type, options, /*numel=*/0);  // holds no state: the test does
    EXPECT_EQ(sliced->state_kinds(), whole->state_kinds()) << type;
    std::vector<torch::Tensor> state;
    for (size_t k = 0; k < whole->state_kinds().size(); ++k) state.push_back(torch::empty({kNumel}));
    sliced->init_state(state);
    for (size_t k = 0; k < state.size(); ++k) {
      EXPECT_TRUE(torch::equal(state[k], whole->state_tensors()[k].second)) << type << ": fresh state";
    }
    torch::Tensor a = initial_param(kNumel), b = a.clone();
    for (int step = 0; step < 5; ++step) {
      const auto g = grad_at(step, kNumel);
      const double lr = lr_at(step, 0.01);
      whole->step(a, g, lr);
      sliced->begin_step();
      for (size_t c = 0; c + 1 < cuts.size(); ++c) {
        const int64_t begin = cuts[c], n = cuts[c + 1] - cuts[c];
        OptimizerSlice slice{b.narrow(0, begin, n), g.narrow(0, begin, n), {}, {}, std::nullopt};
        for (const auto& t : state) slice.state.push_back(t.narrow(0, begin, n));
        sliced->update(slice, lr);
      }
      ASSERT_TRUE(torch::equal(a, b)) << type << " step " << step + 1;
    }
    EXPECT_EQ(sliced->step_count(), 5);
    for (size_t k = 0; k < state.size(); ++k) EXPECT_TRUE(torch::equal(state[k], whole->state_tensors()[k].second));
  }
}

// The offload kernels: Adam on host slices goes through the SIMD CPU Adam, within 1e-6 of the torch arithmetic,
// and writes the 16-bit copy in the same pass, equal to rounding the updated fp32 parameters. The others write it by
// rounding too.
TEST(FlatOptimizer, CpuSimdKernelsAgreeAndWriteThe16BitCopy) {
  AdamOptions o;
  o.weight_decay = 0.1;
  auto reference = make("AdamW", o);
  auto simd = make_flat_optimizer(OptimizerConfig{"AdamW", o}, kNumel, torch::TensorOptions(),
                                  OptimizerKernels::kCpuSimd);
  auto lion = make_flat_optimizer(OptimizerConfig{"Lion", LionOptions{}}, kNumel, torch::TensorOptions(),
                                  OptimizerKernels::kCpuSimd);
  torch::Tensor a = initial_param(kNumel), b = a.clone(), c = a.clone();
  for (auto dtype : {torch::kBFloat16, torch::kFloat16}) {
    for (int step = 0; step < 5; ++step) {
      const auto g = grad_at(step, kNumel);
      reference->step(a, g, 0.01);
      auto p16 = torch::empty({kNumel}, torch::TensorOptions().dtype(dtype));
      OptimizerSlice slice{b, g, {}, p16, std::nullopt};
      for (auto& [kind, t] : simd->state_tensors()) slice.state.push_back(t);
      simd->begin_step();
      simd->update(slice, 0.01);
      ASSERT_LE(rel_error(b, a), 1e-6) << "step " << step + 1;
      EXPECT_TRUE(torch::equal(p16, b.to(dtype))) << "the 16-bit copy is the updated fp32 rounded";

      OptimizerSlice lion_slice{c, g, {lion->state_tensors()[0].second}, p16, std::nullopt};
      lion->begin_step();
      lion->update(lion_slice, 0.01);
      EXPECT_TRUE(torch::equal(p16, c.to(dtype)));
    }
  }
  EXPECT_GT(rel_error(b, initial_param(kNumel)), 1e-3);
}

// torch's fused Adam kernels (the engine's choice for master weights on a GPU; here on the CPU, where torch has them
// too): within 1e-6 of the torch arithmetic for AdamW, Adam with L2 decay and AMSGrad, stepping slices whose groups
// override the weight decay, and writing the 16-bit copy. The gradient is left as it was (L2 adds wd·p inside).
TEST(FlatOptimizer, FusedKernelsAgreeWithTheTorchArithmetic) {
  struct Case {
    std::string type;
    bool adam_w_mode;
    bool amsgrad;
  };
  for (const auto& c : {Case{"AdamW", true, false}, Case{"Adam", false, false}, Case{"AdamW", true, true},
                        Case{"Adam", false, true}}) {
    AdamOptions o;
    o.weight_decay = 0.1;
    o.adam_w_mode = c.adam_w_mode;
    o.amsgrad = c.amsgrad;
    const std::string name = c.type + (c.adam_w_mode ? "" : " L2") + (c.amsgrad ? " amsgrad" : "");
    auto reference = make(c.type, o);
    auto fused = make_flat_optimizer(OptimizerConfig{c.type, o}, kNumel, torch::TensorOptions(),
                                     OptimizerKernels::kFused);
    // The second half of the partition has no weight decay (a bias-and-norm group).
    for (auto* optimizer : {reference.get(), fused.get()}) {
      optimizer->set_groups({GroupSettings{0.0, std::nullopt}}, {GroupRange{kNumel / 2, kNumel - kNumel / 2, 0}});
    }
    torch::Tensor a = initial_param(kNumel), b = a.clone();
    for (int step = 0; step < 5; ++step) {
      const auto g = grad_at(step, kNumel);
      const auto g_before = g.clone();
      reference->step(a, g, 0.01);
      fused->begin_step();
      auto p16 = torch::empty({kNumel}, torch::kBFloat16);
      // Two slices that cut through the group boundary's neighbourhood, as offload's sub-groups would.
      for (const auto& [begin, length] : {std::pair<int64_t, int64_t>{0, 600}, {600, kNumel - 600}}) {
        OptimizerSlice slice{b.narrow(0, begin, length), g.narrow(0, begin, length), {}, p16.narrow(0, begin, length),
                             std::nullopt};
        for (auto& [kind, t] : fused->state_tensors()) slice.state.push_back(t.narrow(0, begin, length));
        fused->update_at(slice, begin, 0.01);
      }
      ASSERT_LE(rel_error(b, a), 1e-6) << name << " step " << step + 1;
      EXPECT_TRUE(torch::equal(p16, b.to(torch::kBFloat16))) << name << ": the 16-bit copy is the updated fp32 rounded";
      EXPECT_TRUE(torch::equal(g, g_before)) << name << ": the gradient was written";
    }
    EXPECT_GT(rel_error(b, initial_param(kNumel)), 1e-3) << name;
    EXPECT_EQ(fused->step_count(), 5);
  }
}

// Parameter groups: every element steps as an optimizer of its group's weight decay and lr would step it (each
// optimizer here is elementwise), whether the partition is stepped whole or in offload-style slices that cut through
// the ranges, and a group's lr moved between steps (a client schedule) takes effect from the next step. Each
// optimizer type, with its own way of decaying (decoupled, L2 into the gradient).
TEST(FlatOptimizer, GroupRangesStepEachRangeWithItsGroupsWeightDecayAndLr) {
  const int64_t n = 40;
  const double base = 0.1, lr = 0.05;
  // Group 0: no decay; group 1: its own decay and lr; group 2: the base decay at an lr of its own, moved at step 2.
  const std::vector<GroupSettings> groups = {{0.0, std::nullopt}, {0.7, 0.02}, {std::nullopt, 0.01}};
  const std::vector<GroupRange> ranges = {{3, 9, 0}, {12, 4, 0}, {25, 6, 1}, {33, 5, 2}};  // two adjacent: merged
  auto group_at = [&](int64_t i) {
    for (const auto& r : ranges) {
      if (i >= r.begin && i < r.begin + r.numel) return r.group;
    }
    return -1;
  };
  auto options_with = [](const std::string& type, double decay) -> OptimizerOptions {
    if (type == "AdamW" || type == "Adam") {
      AdamOptions o;
      o.lr = 0.05;
      o.weight_decay = decay;
      o.adam_w_mode = type == "AdamW";
      return o;
    }
    if (type == "SGD") {
      SgdOptions o;
      o.lr = 0.05;
      o.momentum = 0.9;
      o.weight_decay = decay;
      return o;
    }
    AdagradOptions o;
    o.lr = 0.05;
    o.weight_decay = decay;
    return o;
  };
  for (const std::string type : {"AdamW", "Adam", "SGD", "Adagrad"}) {
    SCOPED_TRACE(type);
    auto whole = make(type, options_with(type, base), n);
    whole->set_groups(groups, ranges);
    EXPECT_EQ(whole->group_ranges().size(), 3u) << "the two adjacent ranges of group 0 are one";
    auto sliced = make(type, options_with(type, base), n);
    sliced->set_groups(groups, ranges);
    // References by group (-1: the optimizer's own settings), each a whole optimizer of that decay.
    std::map<int, std::unique_ptr<FlatOptimizer>> by_group;
    std::map<int, torch::Tensor> reference;
    const std::map<int, double> decay = {{-1, base}, {0, 0.0}, {1, 0.7}, {2, base}};
    for (const auto& [g, d] : decay) {
      by_group[g] = make(type, options_with(type, d), n);
      reference[g] = initial_param(n);
    }
    torch::Tensor p_whole = initial_param(n), p_sliced = initial_param(n);
    for (int k = 0; k < 3; ++k) {
      if (k == 2) {
        whole->set_group_lr(2, 0.03);
        sliced->set_group_lr(2, 0.03);
      }
      const auto g = grad_at(k, n);
      whole->step(p_whole, g, lr);
      sliced->begin_step();
      auto state = sliced->state_tensors();
      for (int64_t begin = 0; begin < n; begin += 7) {  // slices of 7 cut every range somewhere
        const int64_t len = std::min<int64_t>(7, n - begin);
        OptimizerSlice slice{p_sliced.narrow(0, begin, len), g.narrow(0, begin, len), {}, {}, std::nullopt};
        for (auto& [kind, t] : state) slice.state.push_back(t.narrow(0, begin, len));
        sliced->update_at(slice, begin, lr);
      }
      const std::map<int, double> lr_of = {{-1, lr}, {0, lr}, {1, 0.02}, {2, k == 2 ? 0.03 : 0.01}};
      for (auto& [group, opt] : by_group) opt->step(reference[group], g, lr_of.at(group));
    }
    for (int64_t i = 0; i < n; ++i) {
      const float want = reference[group_at(i)][i].item<float>();
      ASSERT_EQ(p_whole[i].item<float>(), want) << "element " << i;
      ASSERT_EQ(p_sliced[i].item<float>(), want) << "element " << i << " (sliced)";
    }
    // The settings differ enough for the comparison to tell them apart.
    EXPECT_FALSE(torch::equal(reference[-1], reference[0]));
    EXPECT_FALSE(torch::equal(reference[-1], reference[2]));
  }
  auto adam = make("AdamW", options_with("AdamW", 0.1), n);
  const std::vector<GroupSettings> one = {{0.0, std::nullopt}};
  EXPECT_THROW(adam->set_groups(one, {{5, 4, 0}, {2, 2, 0}}), std::invalid_argument);  // unsorted
  EXPECT_THROW(adam->set_groups(one, {{5, 4, 0}, {8, 2, 0}}), std::invalid_argument);  // overlapping
  EXPECT_THROW(adam->set_groups(one, {{38, 4, 0}}), std::invalid_argument);            // past the partition
  EXPECT_THROW(adam->set_groups(one, {{5, 4, 1}}), std::invalid_argument);             // no group 1
  EXPECT_THROW(adam->set_groups({{-1.0, std::nullopt}}, {}), std::invalid_argument);   // negative decay
  adam->set_groups(one, {{5, 4, 0}});
  EXPECT_THROW(adam->set_group_lr(1, 0.1), std::invalid_argument);
  EXPECT_THROW(adam->set_group_lr(0, -0.1), std::invalid_argument);
}

TEST(FlatOptimizer, SliceErrorsNameWhatIsWrong) {
  auto adam = make("AdamW", AdamOptions{});
  auto p = torch::zeros({8});
  adam->begin_step();
  try {
    adam->update(OptimizerSlice{p, torch::zeros({8}), {torch::zeros({8})}, {}, std::nullopt}, 1e-3);
    FAIL() << "one state slice for Adam's two";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("expected 2 state slices, got 1"), std::string::npos) << e.what();
  }
  try {
    adam->update(OptimizerSlice{p, torch::zeros({8}), {torch::zeros({8}), torch::zeros({7})}, {}, std::nullopt}, 1e-3);
    FAIL() << "a short state slice";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("state[1] must be a 1-D fp32 tensor of 8 elements"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dscpp
