// LR schedule options: plain values with DeepSpeed's defaults, parsed from the config's "scheduler" section.
// Torch-free, like every schedule file: a schedule is pure arithmetic on the step count.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

namespace dscpp {

enum class WarmupType { kLog, kLinear };

struct WarmupLROptions {
  double warmup_min_lr = 0.0;
  // Unset: WarmupLR warms up to the optimizer's lr (DeepSpeed's None). WarmupDecayLR requires it (its parser fills
  // DeepSpeed's 1e-3).
  std::optional<double> warmup_max_lr;
  int64_t warmup_num_steps = 1000;   // DeepSpeed clamps to >= 2 so that log(N) > 0
  WarmupType warmup_type = WarmupType::kLog;
};

struct WarmupDecayLROptions {
  WarmupLROptions warmup;
  int64_t total_num_steps = 0;       // required, >= warmup_num_steps
};

// Scales the optimizer's own lr by a ratio (unlike WarmupLR, which sets lr absolutely).
struct WarmupCosineLROptions {
  int64_t total_num_steps = 0;       // required
  double warmup_min_ratio = 0.0;
  int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 1e-4;
  WarmupType warmup_type = WarmupType::kLog;
};

// DeepSpeed's OneCycle: lr (and optionally momentum) ramps up over the first half of the cycle, down
// over the second, then decays.
struct OneCycleOptions {
  double cycle_min_lr = 0.0;         // required by DeepSpeed
  double cycle_max_lr = 0.0;         // required by DeepSpeed
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  int64_t cycle_second_step_size = -1;   // -1: same as first
  int64_t cycle_first_stair_count = 0;
  int64_t cycle_second_stair_count = -1; // -1: same as first
  int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
};

// DeepSpeed's LRRangeTest: lr grows from min by rate every step_size steps (linearly or in stairs).
struct LRRangeTestOptions {
  double lr_range_test_min_lr = 1e-3;
  int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

using SchedulerOptions = std::variant<WarmupLROptions, WarmupDecayLROptions, WarmupCosineLROptions,
                                      OneCycleOptions, LRRangeTestOptions>;

struct SchedulerConfig {
  std::string type;                  // "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"
  SchedulerOptions options;
};

}  // namespace dscpp
