// BatchSampler: exact window contents, split-independence of a global batch, seeded per-epoch shuffles.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "data/batch_sampler.h"

namespace gpt {
namespace {

// Token i has value i, so a window's contents tell where it starts.
std::shared_ptr<const TokenDataset> counting_dataset(int64_t n) {
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), uint16_t{0});
  return std::make_shared<const TokenDataset>(std::move(tokens), 65536, "counting tokens");
}

BatchSampler make(int64_t n, int64_t T, DataOrder order, uint64_t seed = 0) {
  return BatchSampler(counting_dataset(n), BatchSamplerOptions{T, order, seed});
}

TEST(BatchSampler, SequentialWindowsAreExpectedTokens) {
  // 103 tokens, T = 10: W = (103 - 1) / 10 = 10 windows starting at 0, 10, ..., 90.
  const auto sampler = make(103, 10, DataOrder::kSequential);
  ASSERT_EQ(sampler.num_windows(), 10);
  const int64_t B = 4;
  for (int64_t step = 0; step < 6; ++step) {  // 24 samples: wraps around the 10 windows twice
    const auto batch = sampler.rows(step, B, 0, B);
    ASSERT_EQ(batch.inputs.sizes().vec(), (std::vector<int64_t>{B, 10}));
    ASSERT_EQ(batch.inputs.scalar_type(), torch::kLong);
    for (int64_t r = 0; r < B; ++r) {
      const int64_t start = ((step * B + r) % 10) * 10;
      for (int64_t t = 0; t < 10; ++t) {
        ASSERT_EQ(batch.inputs[r][t].item<int64_t>(), start + t) << "step " << step << " row " << r;
        ASSERT_EQ(batch.targets[r][t].item<int64_t>(), start + t + 1) << "step " << step << " row " << r;
      }
    }
  }
  // The last window reads the dataset's final usable token (index 100 = 9·10 + 10).
  EXPECT_EQ(sampler.rows(2, 4, 1, 1).targets[0][9].item<int64_t>(), 100);
}

TEST(BatchSampler, GlobalBatchIsIndependentOfTheSplit) {
  for (const auto order : {DataOrder::kSequential, DataOrder::kShuffled}) {
    const auto sampler = make(1000, 16, order, 3);  // W = 62
    const int64_t B = 24;
    for (int64_t step : {0, 1, 7, 100}) {
      const auto whole = sampler.rows(step, B, 0, B);
      for (int64_t m : {1, 2, 3, 6, 12}) {
        std::vector<torch::Tensor> inputs, targets;
        for (int64_t k = 0; k < B / m; ++k) {
          const auto part = sampler.rows(step, B, k * m, m);
          inputs.push_back(part.inputs);
          targets.push_back(part.targets);
        }
        EXPECT_TRUE(torch::equal(torch::cat(inputs), whole.inputs)) << "step " << step << " m " << m;
        EXPECT_TRUE(torch::equal(torch::cat(targets), whole.targets)) << "step " << step << " m " << m;
      }
    }
  }
}

TEST(BatchSampler, ShuffledIsASeededPermutationPerEpoch) {
  const auto a = make(501, 5, DataOrder::kShuffled, 42);  // W = 100
  const auto again = make(501, 5, DataOrder::kShuffled, 42);
  const auto other_seed = make(501, 5, DataOrder::kShuffled, 43);
  const int64_t W = a.num_windows();
  ASSERT_EQ(W, 100);
  std::vector<std::vector<int64_t>> epochs;
  for (int64_t e = 0; e < 3; ++e) {
    std::vector<int64_t> order;
    for (int64_t k = 0; k < W; ++k) order.push_back(a.window_of(e * W + k));
    auto sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int64_t> all(W);
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all) << "epoch " << e << " is not a permutation of the windows";
    epochs.push_back(order);
  }
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);
  std::vector<int64_t> identity(W);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(epochs[0], identity);

  int64_t differ = 0;
  for (int64_t i = 0; i < 3 * W; ++i) {
    EXPECT_EQ(again.window_of(i), a.window_of(i));
    differ += other_seed.window_of(i) != a.window_of(i);
  }
  EXPECT_GT(differ, W);  // another seed gives another order
  // Out-of-order access (a resumed run) sees the same windows as in-order access.
  EXPECT_EQ(make(501, 5, DataOrder::kShuffled, 42).window_of(2 * W + 17), epochs[2][17]);
  // The rows follow the permutation.
  const auto batch = a.rows(3, 8, 2, 1);  // sample 26
  EXPECT_EQ(batch.inputs[0][0].item<int64_t>(), epochs[0][26] * 5);
}

TEST(BatchSampler, ShufflePermutationIsPinned) {
  // Pinned so a code change that alters the data order (and breaks resuming old checkpoints) is noticed.
  EXPECT_EQ(shuffled_windows(8, 1234, 0), shuffled_windows(8, 1234, 0));
  const auto p = shuffled_windows(8, 1234, 0);
  EXPECT_EQ(p, (std::vector<int64_t>{0, 2, 1, 6, 3, 7, 5, 4}));
}

TEST(BatchSampler, TooShortDatasetNamesTheFile) {
  const auto path = (std::filesystem::temp_directory_path() / "gpt_sampler_short.txt").string();
  std::ofstream(path) << "0123456789";  // 10 tokens: 9 targets
  const auto data = std::make_shared<const TokenDataset>(TokenDataset::from_file(path));
  std::filesystem::remove(path);
  EXPECT_EQ(BatchSampler(data, BatchSamplerOptions{9, DataOrder::kSequential, 0}).num_windows(), 1);
  try {
    BatchSampler(data, BatchSamplerOptions{10, DataOrder::kSequential, 0});
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--seq_len 10"), std::string::npos) << e.what();
  }
}

TEST(BatchSampler, RejectsRowsOutsideTheBatch) {
  const auto sampler = make(100, 4, DataOrder::kSequential);
  EXPECT_THROW(sampler.rows(-1, 4, 0, 1), std::invalid_argument);
  EXPECT_THROW(sampler.rows(0, 0, 0, 1), std::invalid_argument);
  EXPECT_THROW(sampler.rows(0, 4, 3, 2), std::invalid_argument);
  EXPECT_THROW(sampler.rows(0, 4, 0, 0), std::invalid_argument);
  EXPECT_THROW(make(100, 0, DataOrder::kSequential), std::invalid_argument);
}

}  // namespace
}  // namespace gpt
