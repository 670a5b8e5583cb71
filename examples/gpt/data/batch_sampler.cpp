// BatchSampler: sample → window arithmetic, per-epoch seeded shuffles, and row gathering into tensors.
#include "data/batch_sampler.h"

#include <map>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>

namespace gpt {
namespace {

// SplitMix64 finalizer: turns (seed, epoch) into a well-mixed 64-bit engine seed.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) without modulo bias: reject the low (2^64 mod bound) draws.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("BatchSampler::rows: " + what);
}

}  // namespace

std::vector<int64_t> shuffled_windows(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  std::mt19937_64 rng(mix(seed ^ mix(static_cast<uint64_t>(epoch))));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(uniform_below(rng, static_cast<uint64_t>(i + 1)));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

// A batch can straddle an epoch boundary, so two epochs are kept.
struct BatchSampler::PermutationCache {
  static constexpr size_t kEpochsKept = 2;
  std::mutex mutex;
  std::map<int64_t, std::vector<int64_t>> by_epoch;
};

BatchSampler::BatchSampler(std::shared_ptr<const TokenDataset> data, BatchSamplerOptions options)
    : data_(std::move(data)), options_(options), cache_(std::make_unique<PermutationCache>()) {
  if (!data_) throw std::invalid_argument("BatchSampler: dataset is null");
  if (options_.seq_len <= 0) {
    throw std::invalid_argument("BatchSampler: --seq_len must be > 0, got " + std::to_string(options_.seq_len));
  }
  num_windows_ = (data_->num_tokens() - 1) / options_.seq_len;
  if (num_windows_ < 1) {
    throw std::invalid_argument(data_->description() + " is too short for one training window: --seq_len " +
                                std::to_string(options_.seq_len) + " needs " +
                                std::to_string(options_.seq_len + 1) + " tokens; use more data or a smaller --seq_len");
  }
}

BatchSampler::~BatchSampler() = default;
BatchSampler::BatchSampler(BatchSampler&&) noexcept = default;
BatchSampler& BatchSampler::operator=(BatchSampler&&) noexcept = default;

const std::vector<int64_t>& BatchSampler::permutation(int64_t epoch) const {
  auto& cached = cache_->by_epoch;
  auto it = cached.find(epoch);
  if (it != cached.end()) return it->second;
  // Training moves forward, so the oldest cached epoch is the one not needed again.
  if (cached.size() >= PermutationCache::kEpochsKept) cached.erase(cached.begin());
  return cached.emplace(epoch, shuffled_windows(num_windows_, options_.seed, epoch)).first->second;
}

int64_t BatchSampler::window_of(int64_t sample) const {
  if (sample < 0) throw std::invalid_argument("BatchSampler::window_of: sample must be >= 0, got " +
                                              std::to_string(sample));
  const int64_t position = sample % num_windows_;
  if (options_.order == DataOrder::kSequential) return position;
  std::lock_guard<std::mutex> lock(cache_->mutex);
  return permutation(sample / num_windows_)[position];
}

Batch BatchSampler::rows(int64_t step, int64_t global_batch, int64_t row_begin, int64_t num_rows) const {
  require(step >= 0, "step must be >= 0, got " + std::to_string(step));
  require(global_batch > 0, "global batch must be > 0, got " + std::to_string(global_batch));
  require(num_rows > 0, "num_rows must be > 0, got " + std::to_string(num_rows));
  require(row_begin >= 0 && row_begin + num_rows <= global_batch,
          "rows [" + std::to_string(row_begin) + ", " + std::to_string(row_begin + num_rows) +
              ") are outside the global batch of " + std::to_string(global_batch));

  const int64_t T = options_.seq_len;
  auto inputs = torch::empty({num_rows, T}, torch::kLong);
  auto targets = torch::empty({num_rows, T}, torch::kLong);
  auto* in = inputs.data_ptr<int64_t>();
  auto* out = targets.data_ptr<int64_t>();
  const auto& tokens = data_->tokens();
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t start = window_of(step * global_batch + row_begin + r) * T;
    for (int64_t t = 0; t < T; ++t) {
      in[r * T + t] = tokens[start + t];
      out[r * T + t] = tokens[start + t + 1];
    }
  }
  return {inputs, targets};
}

}  // namespace gpt
