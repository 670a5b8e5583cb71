// The batch triangle: train_batch_size = micro_batch × grad_accum × world_size.
#pragma once

#include <cstdint>
#include <optional>

#include "dscpp/config/config_error.h"

namespace dscpp {

struct BatchConfig {
  int64_t train_batch_size = 0;         // samples per optimizer step, all ranks together
  int64_t micro_batch = 0;              // "train_micro_batch_size_per_gpu"
  int64_t grad_accum = 0;               // "gradient_accumulation_steps"
};

// Solves the triangle from whichever sides are given: any two determine the third; only train_batch_size
// → grad_accum 1; only micro → grad_accum 1. Throws ConfigError (printing all four numbers) when nothing is
// given, a value is <= 0, a side does not divide, or all three are given and disagree.
BatchConfig resolve_batch(std::optional<int64_t> train_batch_size, std::optional<int64_t> micro_batch,
                          std::optional<int64_t> grad_accum, int world_size);

}  // namespace dscpp
