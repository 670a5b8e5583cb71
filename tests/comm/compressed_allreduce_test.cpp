// compressed_all_reduce (DeepSpeed's error-compensated 1-bit all-reduce) over 2, 3 and 4 real processes against a
// plain-tensor reference of the same algorithm that runs every rank in one process, with no bit packing, over several
// calls so that both error feedbacks carry from call to call; the bit packing against numpy's packbits order; the
// bytes the comms logger counts; and the errors for a wrong buffer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <vector>

#include "../common/multiprocess.h"
#include "compressed_reference.h"
#include "logged_world.h"
#include "dscpp/comm/comm.h"
#include "dscpp/comm/comms_logger.h"
#include "dscpp/comm/compressed_allreduce.h"
#include "dscpp/comm/dist_env.h"

namespace dscpp::testing {
namespace {

constexpr int64_t kNumel = 1000;  // not a multiple of 8 × world at 2, 3 or 4 ranks: their padding is exercised
constexpr int kCalls = 4;

torch::Tensor input(int call, int rank) {
  torch::manual_seed(1000 * call + rank);
  return torch::randn({kNumel});
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

int worker(const std::string& /*scenario*/) {
  const auto job = LoggedWorld::join();
  const int rank = job.rank, world = job.size;
  const auto& comm = job.comm;

  CompressedReference reference(kNumel, world);
  auto errors = CompressionErrors::zeros(kNumel, world, torch::TensorOptions());
  for (int call = 0; call < kCalls; ++call) {
    std::vector<torch::Tensor> inputs;
    for (int r = 0; r < world; ++r) inputs.push_back(input(call, r));
    const auto expected = reference.call(inputs);
    auto buffer = inputs[rank].clone();
    compressed_all_reduce(*comm, buffer, errors);
    const std::string where = "rank " + std::to_string(rank) + "/" + std::to_string(world) + " call " +
                              std::to_string(call) + ": ";
    if (max_diff(buffer, expected) > 1e-6) throw std::runtime_error(where + "result differs from the reference");
    if (max_diff(errors.worker, reference.worker[rank]) > 1e-6) throw std::runtime_error(where + "worker error");
    if (max_diff(errors.server, reference.server[rank]) > 1e-6) throw std::runtime_error(where + "server error");
  }
  // On the wire: the signs twice (all_to_all, then all_gather), 1 bit an element, and two scales per rank.
  const int64_t padded = compressed_padded_numel(kNumel, world);
  const int64_t to_all = job.bytes("all_to_all"), gathered = job.bytes("all_gather"), reduced = job.bytes("all_reduce");
  if (to_all != kCalls * padded / 8 || gathered != kCalls * (padded / 8 + 2 * world * 4) || reduced != 0) {
    throw std::runtime_error("the comms logger counted all_to_all " + std::to_string(to_all) + " and all_gather " +
                             std::to_string(gathered) + " bytes");
  }
  job.world->barrier();
  return 0;
}

TEST(CompressedAllReduce, RanksGiveTheReferencesResultAndErrorsOverSeveralCalls) {
  const std::string self = "/proc/" + std::to_string(::getpid()) + "/exe";
  for (int world : {2, 3, 4}) {
    const auto ranks = run_ranks(world, self + " --worker compressed", "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=1");
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(ranks[r].code, 0) << "world " << world << " rank " << r << ": " << ranks[r].out << ranks[r].err;
    }
  }
}

TEST(CompressedAllReduce, OneRankKeepsTheSignTimesTheScaleAndTheRestAsError) {
  auto comm = make_single_process_comm();
  auto buffer = input(0, 0);
  const auto original = buffer.clone();
  auto errors = CompressionErrors::zeros(kNumel, 1, torch::TensorOptions());
  compressed_all_reduce(*comm, buffer, errors);
  CompressedReference reference(kNumel, 1);
  EXPECT_LE(max_diff(buffer, reference.call({original})), 1e-6);
  // What was sent plus what was kept is what came in (one rank: no padding; the server chunk is the whole buffer).
  EXPECT_LE(max_diff(buffer + errors.worker.narrow(0, 0, kNumel) + errors.server.narrow(0, 0, kNumel), original),
            1e-5);
}

// DeepSpeed's padding (its optimizers' corrected_tensor_size): a multiple of world × lcm(world, 8). It enters the
// scales' √n, so at 3 ranks 1,010 elements pad to 1,080, not to 1,032 (a multiple of 8 × 3).
TEST(CompressedAllReduce, PadsAsDeepSpeedPads) {
  EXPECT_EQ(compressed_padded_numel(1010, 3), 1080);
  EXPECT_EQ(compressed_padded_numel(1010, 2), 1024);
  EXPECT_EQ(compressed_padded_numel(1010, 4), 1024);
  EXPECT_EQ(compressed_padded_numel(5, 5), 200);
  EXPECT_EQ(compressed_padded_numel(1024, 8), 1024);
}

TEST(CompressedAllReduce, PacksSignsFirstElementInTheHighestBit) {
  const auto values = torch::tensor({1.f, -1.f, 0.f, -0.5f, 2.f, 2.f, -3.f, 4.f, -1.f, -1.f, -1.f, -1.f, -1.f, -1.f,
                                     -1.f, 5.f});
  const auto packed = pack_signs(values);
  ASSERT_EQ(packed.numel(), 2);
  EXPECT_EQ(packed[0].item<int>(), 0b10101101);  // 0 counts as positive, as DeepSpeed's plus_minus().add_(1).bool()
  EXPECT_EQ(packed[1].item<int>(), 0b00000001);
  EXPECT_TRUE(torch::equal(unpack_signs(packed), plus_minus(values)));
}

TEST(CompressedAllReduce, RefusesABufferOrErrorsItCannotUse) {
  auto comm = make_single_process_comm();
  auto errors = CompressionErrors::zeros(kNumel, 1, torch::TensorOptions());
  auto half = torch::zeros({kNumel}, torch::kFloat16);
  EXPECT_THROW(compressed_all_reduce(*comm, half, errors), std::invalid_argument);
  auto longer = torch::zeros({kNumel + 8});
  try {
    compressed_all_reduce(*comm, longer, errors);
    ADD_FAILURE() << "accepted errors made for another size";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("CompressionErrors::zeros"), std::string::npos) << e.what();
  }
  EXPECT_THROW(pack_signs(torch::zeros({7})), std::invalid_argument);
}

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) { return dscpp::testing::worker_or_tests(argc, argv, dscpp::testing::worker); }
