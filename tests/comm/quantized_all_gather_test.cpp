// quantized_all_gather (ZeRO++ qwZ): the block layout for several sizes, the int8 blocks against a scalar
// reference of DeepSpeed's symmetric quantizer (bit-exact), the dequantization error bound, and over 2 and 3 real
// processes the gathered values against every rank's shard quantized alone, with the bytes the comms logger counts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <vector>

#include "../common/multiprocess.h"
#include "logged_world.h"
#include "dscpp/comm/comm.h"
#include "dscpp/comm/comms_logger.h"
#include "dscpp/comm/dist_env.h"
#include "dscpp/comm/block_quantizer.h"
#include "dscpp/comm/quantized_all_gather.h"

namespace dscpp::testing {
namespace {

// One block of DeepSpeed's Params<Symmetric, 8> in scalar fp32: scale = 2^8 / (2 max), q = clamp(rint(x · scale)),
// the stored scale 1 / scale.
void reference_block(const float* x, int64_t n, int8_t* q, float* stored) {
  float max = 0;
  for (int64_t i = 0; i < n; ++i) max = std::max(max, std::fabs(x[i]));
  const float scale = max == 0 ? 1.0f : 256.0f / (2.0f * max);
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::nearbyint(x[i] * scale);
    q[i] = static_cast<int8_t>(std::min(127.0f, std::max(-128.0f, v)));
  }
  *stored = 1.0f / scale;
}

torch::Tensor shard_of(int rank, int64_t numel) {
  torch::manual_seed(77 + rank);
  auto x = torch::randn({numel}) * (rank + 1);
  x.narrow(0, 0, std::min<int64_t>(numel, 16)).zero_();  // a run of zeros inside the first block
  return x;
}

TEST(QuantizedAllGather, BlocksAreEqualAndAtMost4096Elements) {
  auto expect = [](int64_t numel, int64_t blocks, int64_t block_numel) {
    const auto layout = quantization_blocks(numel);
    EXPECT_EQ(layout.blocks, blocks) << numel;
    EXPECT_EQ(layout.block_numel, block_numel) << numel;
  };
  expect(5, 1, 8);
  expect(1000, 1, 1000);
  expect(4096, 1, 4096);
  expect(4097, 2, 2056);     // two blocks of 2,049, rounded up to a multiple of 8
  expect(16000, 4, 4000);
  expect(65536, 16, 4096);
  expect(49568, 13, 3816);   // 8 × 4 × 1,549: DeepSpeed's exact division would make 1,549 blocks of 32
  EXPECT_THROW(quantization_blocks(0), std::invalid_argument);
}

TEST(QuantizedAllGather, BlocksEqualTheScalarReferenceBitForBit) {
  for (int64_t numel : {int64_t{5}, int64_t{1000}, int64_t{8005}, int64_t{20001}}) {
    const auto x = shard_of(1, numel);
    const auto blocks = quantize_blocks(x.to(torch::kBFloat16).to(torch::kFloat32), 8);
    const auto layout = quantization_blocks(numel);
    const int64_t padded = layout.padded_numel(), n = layout.blocks, size = layout.block_numel;
    ASSERT_EQ(blocks.values.numel(), padded);
    ASSERT_EQ(blocks.scales.numel(), n);
    auto input = torch::zeros({padded});
    input.narrow(0, 0, numel).copy_(x.to(torch::kBFloat16).to(torch::kFloat32));
    std::vector<int8_t> q(padded);
    std::vector<float> stored(n);
    for (int64_t b = 0; b < n; ++b) {
      reference_block(input.data_ptr<float>() + b * size, size, q.data() + b * size, &stored[b]);
    }
    const auto want_q = torch::from_blob(q.data(), {padded}, torch::kInt8);
    const auto want_s = torch::from_blob(stored.data(), {n}, torch::kFloat32);
    EXPECT_TRUE(torch::equal(blocks.values, want_q)) << numel;
    EXPECT_TRUE(torch::equal(blocks.scales, want_s)) << numel;

    // Every value comes back within one step of its block (half a step, except the block's largest, clamped at 127).
    auto back = torch::empty({numel}, torch::kFloat32);
    dequantize_blocks(blocks, back);
    const auto step = want_s.repeat_interleave(size).narrow(0, 0, numel);
    EXPECT_TRUE(((back - input.narrow(0, 0, numel)).abs() <= step * 1.0001).all().item<bool>()) << numel;
    if (numel > 16) {  // shard_of zeroes the first 16
      EXPECT_GT((back - input.narrow(0, 0, numel)).abs().max().item<float>(), 0) << "nothing was quantized";
    }
  }
  // A block of zeros: scale 1, values 0.
  const auto zeros = quantize_blocks(torch::zeros({64}), 8);
  EXPECT_EQ(zeros.scales.item<float>(), 1.0f);
  EXPECT_EQ(zeros.values.abs().sum().item<int64_t>(), 0);
}

constexpr int64_t kShard = 8005;  // 2 blocks of 4,008: padding to drop on arrival

int worker(const std::string& /*scenario*/) {
  const auto job = LoggedWorld::join();
  const int rank = job.rank, world = job.size;
  const auto& comm = job.comm;

  auto output = torch::empty({world * kShard}, torch::kBFloat16);
  quantized_all_gather(*comm, output, shard_of(rank, kShard).to(torch::kBFloat16)).wait();
  for (int r = 0; r < world; ++r) {
    auto expected = torch::empty({kShard}, torch::kBFloat16);
    dequantize_blocks(quantize_blocks(shard_of(r, kShard).to(torch::kBFloat16), 8), expected);
    if (!torch::equal(output.narrow(0, r * kShard, kShard), expected)) {
      throw std::runtime_error("rank " + std::to_string(rank) + ": rank " + std::to_string(r) +
                               "'s shard differs from its blocks quantized alone");
    }
  }
  // On the wire: one byte an element (padded to 8,016) and 2 fp32 scales per rank, instead of two bytes an element.
  const int64_t gathered = job.bytes("all_gather");
  if (gathered != world * (8016 + 2 * 4)) {
    throw std::runtime_error("the comms logger counted " + std::to_string(gathered) + " all_gather bytes");
  }
  job.world->barrier();
  return 0;
}

TEST(QuantizedAllGather, RanksGetEveryShardAsItsSenderQuantizedIt) {
  const std::string self = "/proc/" + std::to_string(::getpid()) + "/exe";
  for (int world : {2, 3}) {
    const auto ranks = run_ranks(world, self + " --worker gather", "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=1");
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(ranks[r].code, 0) << "world " << world << " rank " << r << ": " << ranks[r].out << ranks[r].err;
    }
  }
}

TEST(QuantizedAllGather, RefusesAnOutputOfAnotherSize) {
  auto comm = make_single_process_comm();
  auto output = torch::empty({kShard + 1});
  try {
    quantized_all_gather(*comm, output, torch::zeros({kShard}));
    ADD_FAILURE() << "accepted an output of another size";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("8006 elements"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) { return dscpp::testing::worker_or_tests(argc, argv, dscpp::testing::worker); }
