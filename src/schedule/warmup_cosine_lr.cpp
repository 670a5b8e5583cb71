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

  double lr_at(int64_t t) const override {
    if (t < 0) return 0.0;  // DeepSpeed's value when built: 0, not the warmup's first ratio
    return base_lr_ * ratio(t);
  }

 private:
  double ratio(int64_t t) const {
    if (t < warmup_steps_) {
      const double gamma = warmup_gamma(t, warmup_steps_, type_);
      return warmup_min_ratio_ + gamma * (1.0 - warmup_min_ratio_);
    }
    // As DeepSpeed 0.19.8 (the release tests/conformance pins): the cosine's progress is clamped to 1, so from
    // total_num_steps on (and after the warmup when total_num_steps <= its length) the ratio stays at cos_min_ratio.
    const double real_last_step = static_cast<double>(t - warmup_steps_ + 1);
    const double real_total_steps = std::max(1.0, static_cast<double>(total_steps_ - warmup_steps_));
    const double progress = std::min(1.0, real_last_step / real_total_steps);
    const double cosine = (1.0 + std::cos(kPi * progress)) / 2.0;
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
  require(options.warmup_num_steps >= 1, "warmup_num_steps", "must be a positive integer", options.warmup_num_steps);
  require(options.warmup_min_ratio >= 0.0 && options.warmup_min_ratio <= 1.0, "warmup_min_ratio",
          "must be in [0, 1]", options.warmup_min_ratio);
  require(options.cos_min_ratio >= 0.0 && options.cos_min_ratio <= 1.0, "cos_min_ratio", "must be in [0, 1]",
          options.cos_min_ratio);
  require(options.total_num_steps >= 1, "total_num_steps", "is required by WarmupCosineLR and must be >= 1",
          options.total_num_steps);
  return std::make_unique<WarmupCosineLR>(options, base_lr);
}

}  // namespace dscpp::detail
