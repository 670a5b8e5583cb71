// NCCL through our comm interface on one GPU: a world-1 ProcessGroupNCCL (init_comm gives a one-process job no
// process group at all, so this is the only place NCCL runs on a one-GPU machine) wrapped by make_comm_over as the
// Python front end wraps torch.distributed's group. Every collective the engine uses runs on CUDA tensors and
// returns this rank's own data, and the handles wait on NCCL's stream. Skipped without a GPU (scripts/device-check.sh
// runs it on a lent one).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "c10d_headers.h"  // src/comm: this test builds its own group, as torch.distributed would
#include "dscpp/comm/comm.h"

#ifdef DSCPP_WITH_NCCL
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

namespace dscpp {
namespace {

#ifdef DSCPP_WITH_NCCL
std::shared_ptr<Comm> one_rank_nccl() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, 0, 1, c10d::ProcessGroupNCCL::Options::create());
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, 0, 1);
  group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  return make_comm_over(group, store, "nccl", "nccl_one_rank/");
}
#endif

TEST(NcclOneRank, EveryCollectiveOnCudaTensors) {
#ifndef DSCPP_WITH_NCCL
  GTEST_SKIP() << "this build has no NCCL";
#else
  if (torch::cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  auto comm = one_rank_nccl();
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->world_size(), 1);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA, 0);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    const auto data = torch::arange(1, 1025, cuda.dtype(dtype));
    auto reduced = data.clone();
    comm->all_reduce(reduced).wait();
    EXPECT_TRUE(torch::equal(reduced, data)) << dtype;
    auto scattered = torch::zeros_like(data);
    comm->reduce_scatter(scattered, data).wait();
    EXPECT_TRUE(torch::equal(scattered, data)) << dtype;
    auto gathered = torch::zeros_like(data);
    comm->all_gather(gathered, data).wait();
    EXPECT_TRUE(torch::equal(gathered, data)) << dtype;
    auto broadcast = data.clone();
    comm->broadcast(broadcast, 0).wait();
    EXPECT_TRUE(torch::equal(broadcast, data)) << dtype;
  }
  auto largest = torch::tensor({3.0f, -1.0f}, cuda);
  comm->all_reduce(largest, ReduceOp::kMax).wait();
  EXPECT_TRUE(torch::equal(largest.cpu(), torch::tensor({3.0f, -1.0f})));
  comm->barrier();
#endif
}

}  // namespace
}  // namespace dscpp
