// quantized_reduce_scatter (ZeRO++ qgZ) and its 4-bit blocks: the blocks against a scalar reference of DeepSpeed's
// symmetric 4-bit quantizer (bit-exact, nibble order included), and over real processes — one level at 2 and 3 ranks,
// two levels at 4 (groups of 2) — every rank's chunk against a one-process reference of the same steps, within a
// stated distance of the exact sum, with the bytes the comms logger counts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <vector>

#include "../common/multiprocess.h"
#include "logged_world.h"
#include "dscpp/comm/block_quantizer.h"
#include "dscpp/comm/comm.h"
#include "dscpp/comm/comms_logger.h"
#include "dscpp/comm/dist_env.h"
#include "dscpp/comm/quantized_reduce_scatter.h"

namespace dscpp::testing {
namespace {

constexpr int64_t kChunk = 2500;  // 3 blocks of 840 per chunk (padded to 2,520)

// Rank `rank`'s gradient buffer: bf16 values (held in fp32), so the bf16 it sends is exactly these.
torch::Tensor gradients_of(int rank, int world) {
  torch::manual_seed(500 + rank);
  return (torch::randn({world * kChunk}) * 1e-3).to(torch::kBFloat16).to(torch::kFloat32);
}

TEST(QuantizedReduceScatter, FourBitBlocksEqualTheScalarReferenceBitForBit) {
  torch::manual_seed(3);
  const auto x = torch::randn({3000});
  const auto q = quantize_blocks(x, 4, kGradientQuantBlock);
  const auto layout = quantization_blocks(3000, kGradientQuantBlock);
  ASSERT_EQ(layout.blocks, 3);
  ASSERT_EQ(layout.block_numel, 1000);
  ASSERT_EQ(q.values.numel(), 1500);
  for (int64_t b = 0; b < layout.blocks; ++b) {
    const float* v = x.data_ptr<float>() + b * 1000;
    float max = 0;
    for (int i = 0; i < 1000; ++i) max = std::max(max, std::fabs(v[i]));
    const float scale = 16.0f / (2.0f * max);
    EXPECT_EQ(q.scales[b].item<float>(), 1.0f / scale);
    for (int i = 0; i < 1000; i += 2) {
      auto nibble = [&](float value) {
        return static_cast<int>(std::min(7.0f, std::max(-8.0f, std::nearbyint(value * scale)))) + 8;
      };
      const int byte = q.values[(b * 1000 + i) / 2].item<int>();
      ASSERT_EQ(byte & 15, nibble(v[i])) << "block " << b << " element " << i;
      ASSERT_EQ(byte >> 4, nibble(v[i + 1])) << "block " << b << " element " << i + 1;
    }
  }
  // Back within one step of each block (half a step, except its largest, clamped at 7).
  auto back = torch::empty({3000});
  dequantize_blocks(q, back);
  const auto step = q.scales.repeat_interleave(1000);
  EXPECT_TRUE(((back - x).abs() <= step * 1.0001).all().item<bool>());
}

// What rank `rank` receives, computed in one process from every rank's input by the same steps: each sender's chunk
// quantized alone and summed by its owner; with `members` > 1, first summed inside each group of `members`
// consecutive ranks, then quantized again and summed over the groups.
torch::Tensor reference(int rank, int world, int members) {
  auto roundtrip = [](const torch::Tensor& t) {
    auto out = torch::empty_like(t);
    dequantize_blocks(quantize_blocks(t, 4, kGradientQuantBlock), out);
    return out;
  };
  auto chunk_of = [&](int sender) { return gradients_of(sender, world).narrow(0, rank * kChunk, kChunk); };
  auto total = torch::zeros({kChunk});
  for (int group = 0; group < world / members; ++group) {
    auto group_sum = torch::zeros({kChunk});
    for (int m = 0; m < members; ++m) group_sum += roundtrip(chunk_of(group * members + m));
    total += members > 1 ? roundtrip(group_sum) : group_sum;
  }
  return total;
}

int worker(const std::string& scenario) {
  const auto job = LoggedWorld::join();
  const int rank = job.rank, world = job.size;
  const int members = scenario == "two_levels" ? 2 : 1;
  std::shared_ptr<Comm> local, across;
  if (members > 1) {
    local = job.world->split(rank / members, rank);
    across = job.world->split(rank % members, rank);
  }
  const auto& comm = job.comm;

  auto output = torch::empty({kChunk});  // fp32: the sum as the owner makes it, before any rounding
  quantized_reduce_scatter(*comm, output, gradients_of(rank, world).to(torch::kBFloat16), local.get(), across.get())
      .wait();
  const std::string where = scenario + " rank " + std::to_string(rank) + "/" + std::to_string(world) + ": ";
  // The same values summed in the same order: equal up to how torch orders a sum over ranks (1e-6).
  const auto expected = reference(rank, world, members);
  if (!torch::allclose(output, expected, 1e-6, 1e-10)) {
    throw std::runtime_error(where + "differs from the reference by " +
                             std::to_string((output - expected).abs().max().item<double>()));
  }
  // What 4 bits lose: the sum stays within 25% of the exact one (relative norm of the difference).
  auto exact = torch::zeros({kChunk});
  for (int r = 0; r < world; ++r) exact += gradients_of(r, world).narrow(0, rank * kChunk, kChunk);
  const double error = (output - exact).norm().item<double>() / exact.norm().item<double>();
  if (error > 0.25) throw std::runtime_error(where + "relative error " + std::to_string(error));
  // On the data-parallel comm (one level): half a byte per element of the padded chunks and a scale per block.
  if (members == 1) {
    const int64_t to_all = job.bytes("all_to_all");
    if (to_all != world * (2520 / 2 + 3 * 4)) {
      throw std::runtime_error(where + "the comms logger counted " + std::to_string(to_all) + " all_to_all bytes");
    }
  }
  std::cout << where << "relative error " << error << "\n";
  job.world->barrier();
  return 0;
}

TEST(QuantizedReduceScatter, RanksGetTheReferencesSumOverOneAndTwoLevels) {
  const std::string self = "/proc/" + std::to_string(::getpid()) + "/exe";
  for (const auto& [world, scenario] : std::vector<std::pair<int, std::string>>{
           {2, "one_level"}, {3, "one_level"}, {4, "two_levels"}}) {
    const auto ranks = run_ranks(world, self + " --worker " + scenario, "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=1");
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(ranks[r].code, 0) << scenario << " world " << world << " rank " << r << ": " << ranks[r].out
                                  << ranks[r].err;
    }
  }
}

TEST(QuantizedReduceScatter, RefusesSizesThatDoNotFit) {
  auto comm = make_single_process_comm();
  auto output = torch::empty({kChunk + 1});
  EXPECT_THROW(quantized_reduce_scatter(*comm, output, torch::zeros({kChunk})), std::invalid_argument);
  EXPECT_THROW(quantize_blocks(torch::zeros({8}), 3), std::invalid_argument);
}

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) { return dscpp::testing::worker_or_tests(argc, argv, dscpp::testing::worker); }
