// The CPU Adam against the flat Adam (torch ops, the foundation issue's reference): every path this CPU has, forced
// one at a time, over odd lengths (vector bodies and tails), Adam and AdamW, with and without bias correction,
// several steps; and its 16-bit copy equal bit for bit to Tensor::to of the updated fp32 parameters.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dscpp/optim/cpu_adam.h"
#include "dscpp/optim/flat_optimizer.h"

namespace dscpp::testing {
namespace {

struct Case {
  SimdPath path;
  int64_t n;
  bool decoupled;
  bool bias_correction;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (auto path : {SimdPath::kScalar, SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (!simd_path_supported(path)) continue;  // a path this CPU lacks cannot run; the others still are checked
    for (int64_t n : {1, 7, 8, 15, 16, 17, 1023, 65536 + 37, 300'001}) {
      out.push_back({path, n, true, true});
      out.push_back({path, n, false, n % 2 == 1});
    }
  }
  return out;
}

void PrintTo(const Case& c, std::ostream* os) {  // not its bytes (ctest, failures)
  *os << to_string(c.path) << ", n " << c.n << (c.decoupled ? ", adamw" : ", adam")
      << (c.bias_correction ? "" : ", no bias correction");
}

class CpuAdam : public ::testing::TestWithParam<Case> {};

TEST_P(CpuAdam, MatchesTheFlatAdamWithin1e6) {
  const auto c = GetParam();
  torch::manual_seed(c.n);
  AdamOptions o;
  o.lr = 1e-2;
  o.betas = {0.9, 0.95};
  o.eps = 1e-6;
  o.weight_decay = 0.1;
  o.adam_w_mode = c.decoupled;
  o.bias_correction = c.bias_correction;
  auto reference = make_flat_optimizer(OptimizerConfig{c.decoupled ? "AdamW" : "Adam", o}, c.n, torch::TensorOptions());
  auto p_ref = torch::randn({c.n});
  auto p = p_ref.clone();
  auto m = torch::zeros({c.n}), v = torch::zeros({c.n});
  auto p16 = torch::empty({c.n}, torch::kBFloat16);
  for (int step = 1; step <= 5; ++step) {
    const auto g = torch::randn({c.n}) * (step % 2 ? 1.0 : 1e-3);
    reference->step(p_ref, g, o.lr);
    AdamStepConfig config;
    config.lr = o.lr;
    config.beta1 = o.betas[0];
    config.beta2 = o.betas[1];
    config.eps = o.eps;
    config.weight_decay = o.weight_decay;
    config.decoupled = c.decoupled;
    config.bias_correction = c.bias_correction;
    config.step = step;
    cpu_adam_step(config, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), c.n,
                  p16.data_ptr(), torch::kBFloat16, c.path, 2);
  }
  const auto state = reference->state_tensors();
  // Largest difference relative to the largest value: element-wise ratios are meaningless where the moments
  // cancel to nearly zero (one rounding of 0.1 is larger than such an element).
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a - b).abs().max() / b.abs().max()).item<double>();
  };
  EXPECT_LE(rel(p, p_ref), 1e-6) << to_string(c.path) << " n " << c.n;
  EXPECT_LE(rel(m, state[0].second), 1e-6) << to_string(c.path) << " n " << c.n;
  EXPECT_LE(rel(v, state[1].second), 1e-6) << to_string(c.path) << " n " << c.n;
  EXPECT_TRUE(torch::equal(p16, p.to(torch::kBFloat16))) << to_string(c.path) << " n " << c.n;
}

INSTANTIATE_TEST_SUITE_P(EveryPath, CpuAdam, ::testing::ValuesIn(cases()), [](const auto& info) {
  const auto& c = info.param;
  return to_string(c.path) + "_n" + std::to_string(c.n) + (c.decoupled ? "_adamw" : "_adam") +
         (c.bias_correction ? "" : "_nobias");
});

// The 16-bit copy rounds exactly as Tensor::to, including ties, subnormals, infinities and NaN, on every path.
TEST(CpuAdamCopy, SixteenBitCopyRoundsAsTensorTo) {
  const int64_t n = 4099;
  auto special = torch::tensor({1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 1e-40f, -1e-40f, 65504.0f, 65520.0f, 1e30f,
                                std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN(), -0.0f, 3.0e-8f});
  for (auto path : {SimdPath::kScalar, SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (!simd_path_supported(path)) continue;
    for (auto dtype : {torch::kBFloat16, torch::kHalf}) {
      auto p = torch::randn({n}) * 100;
      p.narrow(0, 0, special.numel()).copy_(special);
      p.narrow(0, 16, special.numel()).copy_(special);  // inside a vector body too
      auto g = torch::zeros({n}), m = torch::zeros({n}), v = torch::zeros({n});
      AdamStepConfig config;
      config.lr = 0.0;  // the parameters stay as they are: only the copy is under test
      config.weight_decay = 0.0;
      auto out = torch::empty({n}, dtype);
      cpu_adam_step(config, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n,
                    out.data_ptr(), dtype, path, 1);
      const auto want = p.to(dtype);
      // Bitwise everywhere but NaN, which must stay NaN (LibTorch's own scalar and vector conversions give NaN
      // different bit patterns).
      const auto nan = p.isnan();
      EXPECT_TRUE(torch::equal(out.view(torch::kShort).masked_select(~nan), want.view(torch::kShort).masked_select(~nan)))
          << to_string(path) << " " << c10::toString(dtype);
      EXPECT_TRUE(out.to(torch::kFloat32).masked_select(nan).isnan().all().item<bool>()) << to_string(path);
    }
  }
}

// The engine runs this kernel over each rank's partition (ZeRO 1-3) or the whole buffer (ZeRO-0), so an element's
// result must not depend on where its slice starts: a vector path gives the same bits whether the element sits in a
// vector body or in a slice's tail. (The scalar path has no tail to differ; it runs only where no vector path does.)
TEST(CpuAdamSlices, AnElementsResultDoesNotDependOnWhereItsSliceStarts) {
  const int64_t n = 1000;
  for (auto path : {SimdPath::kAvx2, SimdPath::kAvx512}) {
    if (!simd_path_supported(path)) continue;
    torch::manual_seed(7);
    const auto p0 = torch::randn({n}), g = torch::randn({n}), m0 = torch::randn({n}) * 0.1,
               v0 = torch::rand({n}) * 0.01;
    AdamStepConfig config;
    config.lr = 1e-2;
    config.weight_decay = 0.1;
    config.step = 3;
    auto whole_p = p0.clone(), whole_m = m0.clone(), whole_v = v0.clone();
    auto whole16 = torch::empty({n}, torch::kBFloat16);
    cpu_adam_step(config, whole_p.data_ptr<float>(), g.data_ptr<float>(), whole_m.data_ptr<float>(),
                  whole_v.data_ptr<float>(), n, whole16.data_ptr(), torch::kBFloat16, path, 1);
    // Slices of odd lengths (3, 29, 5, ...): most elements land in tails the whole buffer ran through vector bodies.
    auto p = p0.clone(), m = m0.clone(), v = v0.clone();
    auto p16 = torch::empty({n}, torch::kBFloat16);
    for (int64_t begin = 0, len = 3; begin < n; begin += len, len = len * 7 % 31 + 1) {
      const int64_t l = std::min(len, n - begin);
      cpu_adam_step(config, p.data_ptr<float>() + begin, g.data_ptr<float>() + begin, m.data_ptr<float>() + begin,
                    v.data_ptr<float>() + begin, l, static_cast<c10::BFloat16*>(p16.data_ptr()) + begin,
                    torch::kBFloat16, path, 1);
    }
    EXPECT_TRUE(torch::equal(p, whole_p)) << to_string(path);
    EXPECT_TRUE(torch::equal(m, whole_m)) << to_string(path);
    EXPECT_TRUE(torch::equal(v, whole_v)) << to_string(path);
    EXPECT_TRUE(torch::equal(p16, whole16)) << to_string(path);
  }
}

TEST(CpuAdamCopy, RejectsOtherDtypesAndMissingPaths) {
  float x = 0;
  EXPECT_THROW(cpu_adam_step({}, &x, &x, &x, &x, 1, &x, torch::kFloat32), std::invalid_argument);
  if (!simd_path_supported(SimdPath::kAvx512)) {
    EXPECT_THROW(cpu_adam_step({}, &x, &x, &x, &x, 1, nullptr, torch::kBFloat16, SimdPath::kAvx512),
                 std::invalid_argument);
  }
}

}  // namespace
}  // namespace dscpp::testing
