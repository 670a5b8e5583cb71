// Model-state bytes per rank, exact numbers for stages 0-3 at N = 1, 2, 4.
#include <gtest/gtest.h>

#include <stdexcept>

#include "dscpp/zero/memory_estimate.h"

namespace dscpp {
namespace {

constexpr int64_t kPsi = 1'000'000;  // divisible by 1, 2, 4: formulas are exact

// Each optimizer's state is what its state_tensors() (partitioned) and rank_state() (1-bit error feedback: a worker
// error of Ψ and a server error of Ψ/N, this rank's) hold.
TEST(MemoryEstimate, OptimizerStateIsWhatEachOptimizerKeeps) {
  const auto state = [](const std::optional<OptimizerConfig>& optimizer, int stage, int n) {
    return model_state_bytes(stage, kPsi, n, OffloadDevice::kNone, DType::kBFloat16, optimizer_state_shape(optimizer))
        .optimizer_state;
  };
  const int64_t shard = kPsi / 4;
  EXPECT_EQ(state(OptimizerConfig{"AdamW", AdamOptions{}}, 1, 4), 8 * shard);
  AdamOptions amsgrad;
  amsgrad.amsgrad = true;
  EXPECT_EQ(state(OptimizerConfig{"Adam", amsgrad}, 1, 4), 12 * shard);
  EXPECT_EQ(state(OptimizerConfig{"SGD", SgdOptions{}}, 1, 4), 0);  // no momentum: no buffer
  SgdOptions momentum;
  momentum.momentum = 0.9;
  EXPECT_EQ(state(OptimizerConfig{"SGD", momentum}, 1, 4), 4 * shard);
  EXPECT_EQ(state(OptimizerConfig{"Lion", LionOptions{}}, 3, 4), 4 * shard);
  EXPECT_EQ(state(OptimizerConfig{"Adagrad", AdagradOptions{}}, 2, 4), 4 * shard);
  EXPECT_EQ(state(OptimizerConfig{"Lamb", LambOptions{}}, 1, 4), 8 * shard);
  EXPECT_EQ(state(OptimizerConfig{"OneBitAdam", OneBitAdamOptions{}}, 0, 4), 8 * kPsi + 4 * (kPsi + kPsi / 4));
  EXPECT_EQ(state(OptimizerConfig{"OneBitLamb", OneBitLambOptions{}}, 0, 4), 12 * kPsi + 4 * (kPsi + kPsi / 4));
  EXPECT_EQ(state(std::nullopt, 1, 4), 8 * shard);
  EXPECT_TRUE(optimizer_state_shape(std::nullopt).assumed);
  EXPECT_FALSE(optimizer_state_shape(OptimizerConfig{"Lion", LionOptions{}}).assumed);
}

TEST(MemoryEstimate, SixteenBitAdamMatchesZeroPaper) {
  for (int n : {1, 2, 4}) {
    const int64_t expected[4] = {16 * kPsi, 4 * kPsi + 12 * kPsi / n, 2 * kPsi + 14 * kPsi / n, 16 * kPsi / n};
    for (int stage = 0; stage <= 3; ++stage) {
      for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
        ModelStateBytes b = model_state_bytes(stage, kPsi, n, OffloadDevice::kNone, dtype);
        EXPECT_EQ(b.device, expected[stage]) << "stage " << stage << " N " << n;
        EXPECT_EQ(b.total, expected[stage]);
        EXPECT_EQ(b.host, 0);
        EXPECT_EQ(b.params + b.grads + b.master32 + b.optimizer_state, b.device);
      }
    }
  }
  ModelStateBytes s2 = model_state_bytes(2, kPsi, 4, OffloadDevice::kNone, DType::kFloat16);
  EXPECT_EQ(s2.params, 2 * kPsi);
  EXPECT_EQ(s2.grads, 2 * kPsi / 4);
  EXPECT_EQ(s2.master32, 4 * kPsi / 4);
  EXPECT_EQ(s2.optimizer_state, 8 * kPsi / 4);
}

TEST(MemoryEstimate, CpuOffloadMovesMasterAndStateToHost) {
  for (int n : {1, 2, 4}) {
    const int64_t device[4] = {4 * kPsi, 4 * kPsi, 2 * kPsi + 2 * kPsi / n, 4 * kPsi / n};
    for (int stage = 0; stage <= 3; ++stage) {
      ModelStateBytes b = model_state_bytes(stage, kPsi, n, OffloadDevice::kCpu, DType::kFloat16);
      const int64_t host = stage == 0 ? 12 * kPsi : 12 * kPsi / n;
      EXPECT_EQ(b.device, device[stage]) << "stage " << stage << " N " << n;
      EXPECT_EQ(b.host, host);
      EXPECT_EQ(b.nvme, 0);
      EXPECT_EQ(b.total, device[stage] + host);
    }
  }
  ModelStateBytes nvme = model_state_bytes(3, kPsi, 2, OffloadDevice::kNvme, DType::kBFloat16);
  EXPECT_EQ(nvme.nvme, 6 * kPsi);
  EXPECT_EQ(nvme.host, 0);
  EXPECT_EQ(nvme.device, 2 * kPsi);
}

TEST(MemoryEstimate, Fp32ParamsAreTheMaster) {
  for (int n : {1, 2, 4}) {
    const int64_t expected[4] = {16 * kPsi, 8 * kPsi + 8 * kPsi / n, 4 * kPsi + 12 * kPsi / n, 16 * kPsi / n};
    for (int stage = 0; stage <= 3; ++stage) {
      ModelStateBytes b = model_state_bytes(stage, kPsi, n, OffloadDevice::kNone, DType::kFloat32);
      EXPECT_EQ(b.master32, 0);
      EXPECT_EQ(b.device, expected[stage]) << "stage " << stage << " N " << n;
    }
    // Offloaded, the CPU step keeps its own fp32 copy of the shard next to the state.
    ModelStateBytes off = model_state_bytes(2, kPsi, n, OffloadDevice::kCpu, DType::kFloat32);
    EXPECT_EQ(off.device, 4 * kPsi + 4 * kPsi / n);
    EXPECT_EQ(off.host, 12 * kPsi / n);
  }
}

TEST(MemoryEstimate, UnevenShardsRoundUp) {
  ModelStateBytes b = model_state_bytes(3, 10, 4, OffloadDevice::kNone, DType::kFloat16);
  EXPECT_EQ(b.total, 16 * 3);  // ceil(10 / 4) = 3 elements per rank
}

TEST(MemoryEstimate, RejectsBadArguments) {
  EXPECT_THROW(model_state_bytes(4, kPsi, 1, OffloadDevice::kNone, DType::kFloat16), std::invalid_argument);
  EXPECT_THROW(model_state_bytes(1, -1, 1, OffloadDevice::kNone, DType::kFloat16), std::invalid_argument);
  EXPECT_THROW(model_state_bytes(1, kPsi, 0, OffloadDevice::kNone, DType::kFloat16), std::invalid_argument);
}

}  // namespace
}  // namespace dscpp
