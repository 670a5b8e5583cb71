// gpt-train's HF-style flags that fill a config's "auto", shared with `dscpp plan` so that both resolve a config the
// same way: one list of flags, one set of defaults, one filling rule (a config plan accepts is one gpt-train runs).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>

#include "dscpp/config/config.h"

namespace gpt {

struct AutoFlags {
  double lr = 1e-3, weight_decay = 0.1, clip = 1.0;
  std::optional<int64_t> micro_batch;   // default kDefaultMicroBatch, where the config's batch numbers leave it free
  std::optional<int64_t> grad_accum;    // default: what the batch triangle solves (1 when free)
  std::optional<int64_t> warmup_steps;  // default: a tenth of the run's steps
  std::optional<int64_t> total_steps;   // default: the run's steps (at least 3)
  bool bf16 = false, fp16 = false;      // neither: both "auto" enabled flags fill false, as the HF Trainer's
};

constexpr int64_t kDefaultMicroBatch = 8;
constexpr int64_t kDefaultSteps = 150;  // gpt-train's --steps

// Registers --lr --weight_decay --clip --micro_batch --grad_accum --warmup_steps --total_steps --bf16 --fp16.
void add_auto_flags(CLI::App& app, AutoFlags& flags);

// What fills "auto" for a run of `steps` optimizer steps on a model `hidden_size` wide (none: the bucket sizes that
// derive from the width stay unfilled).
dscpp::AutoValues auto_values(const AutoFlags& flags, int64_t steps, std::optional<int64_t> hidden_size);

}  // namespace gpt
