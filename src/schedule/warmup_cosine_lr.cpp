// WarmupCosineLR: scales the optimizer's own lr by a ratio that warms up from warmup_min_ratio to 1,
// then follows a half cosine down to cos_min_ratio at total_num_steps (DeepSpeed's get_lr_ratio).
#include <algorithm>
#include <cmath>

#include "schedules.h"

namespace dscpp::detail {
namespace {

constexpr double kPi = 3.14159265358979323846;

class WarmupCosineLR final : public LRSchedule {
 public:
  WarmupCosineLR(const WarmupCosineLROptions& options, double base_lr)
      : base_lr_(base_lr),
        total_steps_(options.total_num_steps),
        warmup_min_ratio_(options.warmup_min_ratio),
        warmup_steps_(effective_warmup_steps(options.warmup_num_steps)),
        cos_min_ratio_(options.cos_min_ratio),
        type_(options.warmup_type) {}

  double lr_at(int64_t t) const override { return base_lr_ * ratio(std::max<int64_t>(t, 0)); }

 private:
  double ratio(int64_t t) const {
    if (t < warmup_steps_) {
      const double gamma = warmup_gamma(t, warmup_steps_, type_);
      return warmup_min_ratio_ + gamma * (1.0 - warmup_min_ratio_);
    }
    // As DeepSpeed: past total_num_steps the cosine is not clamped (it rises again); training normally
    // ends at total_num_steps, and matching DeepSpeed keeps "dscpp plan" schedules comparable.
    const double real_last_step = static_cast<double>(t - warmup_steps_ + 1);
    const double real_total_steps = static_cast<double>(total_steps_ - warmup_steps_);
    const double cosine = (1.0 + std::cos(kPi * real_last_step / real_total_steps)) / 2.0;
    return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
  }

  double base_lr_;
  int64_t total_steps_;
  double warmup_min_ratio_;
  int64_t warmup_steps_;  // clamped to >= 2
  double cos_min_ratio_;
  WarmupType type_;
};

}  // namespace

std::unique_ptr<LRSchedule> make_warmup_cosine_lr(const WarmupCosineLROptions& options, double base_lr) {
  require(base_lr >= 0.0, "lr", "(the optimizer's lr, which WarmupCosineLR scales) must be >= 0", base_lr);
  require(options.warmup_num_steps >= 0, "warmup_num_steps", "must be >= 0", options.warmup_num_steps);
  require(options.warmup_min_ratio >= 0.0 && options.warmup_min_ratio <= 1.0, "warmup_min_ratio",
          "must be in [0, 1]", options.warmup_min_ratio);
  require(options.cos_min_ratio >= 0.0 && options.cos_min_ratio <= 1.0, "cos_min_ratio", "must be in [0, 1]",
          options.cos_min_ratio);
  // DeepSpeed divides by (T - N): T == N crashes it and T < N makes the cosine oscillate, so both are errors.
  const int64_t warmup = effective_warmup_steps(options.warmup_num_steps);
  if (options.total_num_steps <= warmup) {
    throw std::invalid_argument(
        "scheduler.params.total_num_steps is required by WarmupCosineLR and must be greater than "
        "warmup_num_steps (" + std::to_string(warmup) + (options.warmup_num_steps < 2 ? ", after the clamp to >= 2" : "") +
        "), got " + std::to_string(options.total_num_steps));
  }
  return std::make_unique<WarmupCosineLR>(options, base_lr);
}

}  // namespace dscpp::detail
