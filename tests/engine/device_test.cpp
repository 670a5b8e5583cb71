// Which device a rank trains on (dscpp/engine/device.h). Here: the CUDA torch wheel and no GPU; the CUDA branches
// run under DSCPP_TEST_DEVICE=cuda on a GPU machine.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "dscpp/engine/device.h"

namespace dscpp {
namespace {

std::string error_of(const std::string& requested, int local_rank = 0) {
  try {
    rank_device(requested, local_rank);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(RankDevice, CpuIsTheCpuWhateverTheRank) {
  EXPECT_EQ(rank_device("cpu", 0), torch::Device(torch::kCPU));
  EXPECT_EQ(rank_device("cpu", 5), torch::Device(torch::kCPU));
}

TEST(RankDevice, AutoIsTheCpuWithoutAGpuAndTheRanksGpuWithOne) {
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  if (gpus == 0) {
    EXPECT_EQ(rank_device("auto", 3), torch::Device(torch::kCPU));
  } else {
    EXPECT_EQ(rank_device("auto", 3), torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(3 % gpus)));
  }
}

TEST(RankDevice, CudaWithoutAGpuIsAnErrorSayingWhy) {
  if (torch::cuda::device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  const auto error = error_of("cuda");
  EXPECT_NE(error.find("device cuda"), std::string::npos) << error;
  // A CUDA torch without a GPU names the device, a CPU-only torch its lack of CUDA.
#ifdef DSCPP_TORCH_HAS_CUDA
  EXPECT_NE(error.find("no GPU is visible"), std::string::npos) << error;
#else
  EXPECT_NE(error.find("no CUDA"), std::string::npos) << error;
#endif
  EXPECT_NE(error.find("use cpu"), std::string::npos) << error;
}

TEST(RankDevice, AnythingElseNamesTheChoices) {
  const auto error = error_of("gpu");
  EXPECT_NE(error.find("device 'gpu'"), std::string::npos) << error;
  EXPECT_NE(error.find("cpu, cuda or auto"), std::string::npos) << error;
}

TEST(CommBackendFor, GlooOnTheCpuAtAnyWorldSize) {
  EXPECT_EQ(comm_backend_for(torch::kCPU, 1), CommBackend::kGloo);
  EXPECT_EQ(comm_backend_for(torch::kCPU, 8), CommBackend::kGloo);
}

TEST(CommBackendFor, NcclOnlyWithAGpuPerLocalRank) {
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  if (gpus == 0) GTEST_SKIP() << "no GPU: a CUDA device cannot be named here";
  const torch::Device gpu(torch::kCUDA, 0);
  EXPECT_EQ(comm_backend_for(gpu, gpus), CommBackend::kNccl);
  EXPECT_EQ(comm_backend_for(gpu, gpus + 1), CommBackend::kGloo);  // two ranks would share a GPU
}

}  // namespace
}  // namespace dscpp
