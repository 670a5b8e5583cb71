// WarmupDecayLR: WarmupLR's warmup, then a linear decay to 0 at total_num_steps (and 0 after).
#include <algorithm>
#include <cmath>

#include "schedules.h"

namespace dscpp::detail {

namespace {

class WarmupDecayLR final : public LRSchedule {
 public:
  explicit WarmupDecayLR(const WarmupDecayLROptions& options)
      : min_lr_(options.warmup.warmup_min_lr),
        delta_lr_(*options.warmup.warmup_max_lr - options.warmup.warmup_min_lr),
        warmup_steps_(effective_warmup_steps(options.warmup.warmup_num_steps)),
        total_steps_(options.total_num_steps),
        type_(options.warmup.warmup_type) {}

  double lr_at(int64_t t) const override {
    if (t < 0) return min_lr_;  // set when built, as WarmupLR
    return min_lr_ + delta_lr_ * gamma(t);
  }

 private:
  double gamma(int64_t t) const {
    if (t < warmup_steps_) return warmup_gamma(t, warmup_steps_, type_);
    // DeepSpeed: max(0, (T - t) / max(1, T - N)), N being the clamped warmup length.
    const double remaining = static_cast<double>(total_steps_ - t);
    const double span = std::max(1.0, static_cast<double>(total_steps_ - warmup_steps_));
    return std::max(0.0, remaining / span);
  }

  double min_lr_;
  double delta_lr_;
  int64_t warmup_steps_;  // clamped to >= 2
  int64_t total_steps_;
  WarmupType type_;
};

}  // namespace

std::unique_ptr<LRSchedule> make_warmup_decay_lr(const WarmupDecayLROptions& options) {
  // One place for DeepSpeed's default (1e-3): the config parser, which also writes it into the resolved config.
  if (!options.warmup.warmup_max_lr) {
    throw std::invalid_argument("scheduler.params.warmup_max_lr is required by WarmupDecayLR (the config's parser "
                                "fills DeepSpeed's default, 1e-3)");
  }
  validate_warmup(options.warmup);
  require(options.total_num_steps >= 1, "total_num_steps", "is required by WarmupDecayLR and must be >= 1",
          options.total_num_steps);
  if (options.total_num_steps < options.warmup.warmup_num_steps) {
    throw std::invalid_argument("scheduler.params.total_num_steps (" + std::to_string(options.total_num_steps) +
                                ") must be >= scheduler.params.warmup_num_steps (" +
                                std::to_string(options.warmup.warmup_num_steps) + ")");
  }
  return std::make_unique<WarmupDecayLR>(options);
}

}  // namespace dscpp::detail
