// DeviceMemoryCounter: the caching allocator's counts of one GPU, as memory_breakdown reads them (skipped without a
// GPU); the CPU is refused, naming the counter it has instead.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "dscpp/monitor/device_memory.h"

namespace dscpp {
namespace {

TEST(DeviceMemoryCounter, TheCpuIsRefusedNamingItsOwnCounter) {
  try {
    DeviceMemoryCounter counter(torch::kCPU);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("CpuMemoryTracker"), std::string::npos) << e.what();
  }
}

TEST(DeviceMemoryCounter, CountsATensorAndItsPeakUntilReset) {
  if (torch::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  const torch::Device gpu(torch::kCUDA, 0);
  DeviceMemoryCounter counter(gpu);
  const int64_t before = counter.allocated();
  {
    auto held = torch::empty({1 << 20}, torch::TensorOptions().device(gpu));  // 4 MiB
    EXPECT_GE(counter.allocated() - before, int64_t{4} << 20);
    counter.reset_peak();
    { auto brief = torch::empty({1 << 22}, torch::TensorOptions().device(gpu)); }  // 16 MiB, freed at once
    EXPECT_GE(counter.peak() - counter.allocated(), int64_t{16} << 20) << "the freed tensor stays in the peak";
  }
  EXPECT_EQ(counter.allocated(), before);
  counter.reset_peak();
  EXPECT_EQ(counter.peak(), counter.allocated());
}

}  // namespace
}  // namespace dscpp
