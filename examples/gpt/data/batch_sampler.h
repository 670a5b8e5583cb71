// BatchSampler: which tokens each row of each optimizer step trains on. Stateless by design — the global batch
// of step s is samples [s·B, (s+1)·B) of one infinite sample stream — so a checkpoint's data position is just
// its step count, and the same global batch comes out whatever the world size and micro-batch split.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "data/token_dataset.h"

namespace gpt {

enum class DataOrder {
  kSequential,  // sample i reads window i mod W
  kShuffled,    // sample i reads window perm_e[i mod W], perm_e a seeded permutation for epoch e = i / W
};

struct BatchSamplerOptions {
  int64_t seq_len = 128;                   // T: tokens per row; a sample is a window of T + 1 tokens
  DataOrder order = DataOrder::kShuffled;  // window order
  uint64_t seed = 0;                       // shuffle seed; independent of torch's RNG (std::mt19937_64)
};

struct Batch {
  torch::Tensor inputs;   // (rows, T) int64: window tokens [0, T)
  torch::Tensor targets;  // (rows, T) int64: window tokens [1, T + 1)
};

class BatchSampler {
 public:
  // Window w covers tokens [w·T, w·T + T] of the dataset, w < W = (num_tokens − 1) / T (non-overlapping inputs,
  // the last partial window dropped). Throws std::invalid_argument if seq_len ≤ 0 or the dataset (named by its
  // description) is shorter than one window.
  BatchSampler(std::shared_ptr<const TokenDataset> data, BatchSamplerOptions options);
  ~BatchSampler();
  BatchSampler(BatchSampler&&) noexcept;
  BatchSampler& operator=(BatchSampler&&) noexcept;

  // Rows [row_begin, row_begin + num_rows) of step `step`'s global batch of `global_batch` samples.
  // Rank r of W with micro-batch m at accumulation micro-step j takes row_begin = r·(B/W) + j·m, num_rows = m.
  Batch rows(int64_t step, int64_t global_batch, int64_t row_begin, int64_t num_rows) const;

  // The window that sample `sample` (0-based position in the infinite stream) reads.
  int64_t window_of(int64_t sample) const;

  int64_t num_windows() const { return num_windows_; }
  int64_t seq_len() const { return options_.seq_len; }
  const TokenDataset& dataset() const { return *data_; }

 private:
  struct PermutationCache;
  const std::vector<int64_t>& permutation(int64_t epoch) const;  // caller holds cache_->mutex

  std::shared_ptr<const TokenDataset> data_;
  BatchSamplerOptions options_;
  int64_t num_windows_;                       // W
  std::unique_ptr<PermutationCache> cache_;  // the last epochs' permutations; rows() is const but O(W) to shuffle
};

// The Fisher–Yates permutation of [0, n) that shuffled order uses for `epoch`: depends only on (seed, epoch),
// identical on every platform (own bounded draw instead of the implementation-defined std distributions).
std::vector<int64_t> shuffled_windows(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace gpt
