// WarmupLR: lr rises from warmup_min_lr to warmup_max_lr over warmup_num_steps (log or linear), then stays.
// Also home of the warmup curve shared with WarmupDecayLR and WarmupCosineLR (DeepSpeed's _get_gamma).
#include <algorithm>
#include <cmath>

#include "schedules.h"

namespace dscpp::detail {

double warmup_gamma(int64_t t, int64_t n, WarmupType type) {
  if (type == WarmupType::kLinear) return static_cast<double>(t) / static_cast<double>(n);
  // Same operation order as DeepSpeed (inverse computed once), so values agree to the last bit.
  const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(n));
  return inverse_log_warm_up * std::log(static_cast<double>(t + 1));
}

namespace {

class WarmupLR final : public LRSchedule {
 public:
  WarmupLR(const WarmupLROptions& options, double max_lr)
      : min_lr_(options.warmup_min_lr),
        delta_lr_(max_lr - options.warmup_min_lr),
        warmup_steps_(effective_warmup_steps(options.warmup_num_steps)),
        type_(options.warmup_type) {}

  double lr_at(int64_t t) const override {
    if (t < 0) return min_lr_;  // set when built (DeepSpeed's get_lr before the first step)
    const double gamma = t < warmup_steps_ ? warmup_gamma(t, warmup_steps_, type_) : 1.0;
    return min_lr_ + delta_lr_ * gamma;
  }

 private:
  double min_lr_;
  double delta_lr_;
  int64_t warmup_steps_;  // clamped to >= 2
  WarmupType type_;
};

}  // namespace

void validate_warmup(const WarmupLROptions& options) {
  require(options.warmup_min_lr >= 0.0, "warmup_min_lr", "must be >= 0", options.warmup_min_lr);
  if (options.warmup_max_lr) {
    require(*options.warmup_max_lr >= 0.0, "warmup_max_lr", "must be >= 0", *options.warmup_max_lr);
  }
  require(options.warmup_num_steps >= 1, "warmup_num_steps", "must be a positive integer", options.warmup_num_steps);
}

std::unique_ptr<LRSchedule> make_warmup_lr(const WarmupLROptions& options, double base_lr) {
  validate_warmup(options);
  // Without warmup_max_lr the warmup ends at the optimizer's lr, as DeepSpeed's WarmupLR (0.19.8) does.
  if (!options.warmup_max_lr) {
    require(base_lr >= 0.0, "warmup_max_lr",
            "is unset, so the warmup ends at the optimizer's lr, which must be a number >= 0", base_lr);
  }
  return std::make_unique<WarmupLR>(options, options.warmup_max_lr.value_or(base_lr));
}

}  // namespace dscpp::detail
