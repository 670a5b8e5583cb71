// StagingPool: the fallbacks' temporaries are reused, never shared while lent out, and bounded in number.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "../../src/comm/staging_pool.h"

namespace dscpp {
namespace {

const torch::Device kCpu(torch::kCPU);

TEST(StagingPool, ReusesABufferGivenBack) {
  StagingPool pool;
  auto a = pool.take(1000, torch::kFloat, kCpu);
  ASSERT_EQ(a.numel(), 1000);
  const void* storage = a.data_ptr();
  pool.give_back(a);
  EXPECT_EQ(pool.free_bytes(), 4000);
  auto b = pool.take(600, torch::kFloat, kCpu);  // a smaller request fits the same buffer
  EXPECT_EQ(b.numel(), 600);
  EXPECT_EQ(b.data_ptr(), storage);
  EXPECT_EQ(pool.free_bytes(), 0);
  pool.give_back(b);  // a narrowed view gives back the whole buffer
  EXPECT_EQ(pool.free_bytes(), 4000);
  EXPECT_EQ(pool.take(1000, torch::kFloat, kCpu).data_ptr(), storage);
}

TEST(StagingPool, NeverLendsOneBufferTwice) {
  StagingPool pool;
  auto a = pool.take(64, torch::kFloat, kCpu);
  auto b = pool.take(64, torch::kFloat, kCpu);
  EXPECT_NE(a.data_ptr(), b.data_ptr());
  pool.give_back(a);
  auto c = pool.take(64, torch::kFloat, kCpu);
  EXPECT_EQ(c.data_ptr(), a.data_ptr());
  auto d = pool.take(64, torch::kFloat, kCpu);  // a is lent out again: a fresh buffer
  EXPECT_NE(d.data_ptr(), a.data_ptr());
  EXPECT_NE(d.data_ptr(), b.data_ptr());
}

TEST(StagingPool, MatchesDtypeAndSizeAndPicksTheSmallestFit) {
  static_assert(StagingPool::kMaxFree >= 2, "the test gives back two buffers at once");
  StagingPool pool;
  auto small = pool.take(100, torch::kFloat, kCpu);
  auto large = pool.take(10000, torch::kFloat, kCpu);
  const void* small_at = small.data_ptr();
  const void* large_at = large.data_ptr();
  pool.give_back(large);
  pool.give_back(small);
  auto got = pool.take(50, torch::kFloat, kCpu);
  EXPECT_EQ(got.data_ptr(), small_at);
  EXPECT_EQ(got.scalar_type(), torch::kFloat);
  auto bigger = pool.take(5000, torch::kFloat, kCpu);  // small is lent out and too small anyway
  EXPECT_EQ(bigger.data_ptr(), large_at);

  auto half = pool.take(10000, torch::kBFloat16, kCpu);
  const void* half_at = half.data_ptr();
  pool.give_back(half);
  auto none_fits = pool.take(5000, torch::kFloat, kCpu);  // the free bf16 buffer is not fp32
  EXPECT_NE(none_fits.data_ptr(), half_at);
  EXPECT_EQ(none_fits.scalar_type(), torch::kFloat);
  EXPECT_EQ(pool.take(10000, torch::kBFloat16, kCpu).data_ptr(), half_at);
}

TEST(StagingPool, KeepsAtMostKMaxFreeDroppingTheSmallest) {
  StagingPool pool;
  std::vector<at::Tensor> lent;
  for (size_t i = 0; i <= StagingPool::kMaxFree; ++i) lent.push_back(pool.take(int64_t(i + 1) * 10, torch::kFloat, kCpu));
  for (auto& t : lent) pool.give_back(t);
  int64_t kept = 0;
  for (size_t i = 1; i <= StagingPool::kMaxFree; ++i) kept += int64_t(i + 1) * 10 * 4;
  EXPECT_EQ(pool.free_bytes(), kept);  // the 10-element one went
}

}  // namespace
}  // namespace dscpp
