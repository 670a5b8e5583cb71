// squared_norm_fp64: every square summed in fp64 (DeepSpeed's ZeRO global norm), not fp32 norms combined in fp64.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dscpp/zero/grad_norm.h"

namespace dscpp {
namespace {

TEST(SquaredNormFp64, EqualsTheFp64SumOfSquares) {
  torch::manual_seed(3);
  // Several chunks and a ragged tail, with a wide range of magnitudes as gradients have.
  const int64_t n = 3 * (int64_t{1} << 20) + 12345;
  const auto t = torch::randn({n}) * torch::logspace(-4, 3, n);
  const double exact = t.to(torch::kFloat64).square().sum().item<double>();
  const auto got = squared_norm_fp64(t);
  EXPECT_EQ(got.scalar_type(), torch::kFloat64);
  EXPECT_EQ(got.dim(), 0);
  // fp32 norms of 64 Ki-element rows combined in fp64 (the previous method) are off by ~1e-7 relative here.
  EXPECT_NEAR(got.item<double>() / exact, 1.0, 1e-12);
}

TEST(SquaredNormFp64, TakesAnyShapeAndDtype) {
  const auto t = torch::arange(1, 7, torch::kFloat32).view({2, 3});
  EXPECT_DOUBLE_EQ(squared_norm_fp64(t).item<double>(), 91.0);
  EXPECT_DOUBLE_EQ(squared_norm_fp64(t.to(torch::kBFloat16)).item<double>(), 91.0);
  EXPECT_DOUBLE_EQ(squared_norm_fp64(torch::empty({0})).item<double>(), 0.0);
}

}  // namespace
}  // namespace dscpp
