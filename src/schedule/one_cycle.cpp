// OneCycle (DeepSpeed's 1Cycle policy): lr rises from cycle_min_lr to cycle_max_lr over the first step size,
// falls back over the second, then decays; momentum (beta1) moves the opposite way. Stair counts hold lr and
// momentum flat over equal parts of each half, as DeepSpeed 0.19.8 (the release tests/conformance pins) does.
#include <algorithm>
#include <cmath>
#include <optional>

#include "schedules.h"

namespace dscpp::detail {
namespace {

// DeepSpeed's OneCycle writes betas = (cycled momentum, 0.99) into each param group: beta2 becomes 0.99 whatever the
// optimizer's was. Kept, so that a config trains as it does under DeepSpeed.
constexpr double kOneCycleBeta2 = 0.99;

class OneCycle final : public LRSchedule {
 public:
  explicit OneCycle(const OneCycleOptions& options)
      : options_(options),
        first_size_(static_cast<double>(options.cycle_first_step_size)),
        second_size_(options.cycle_second_step_size == -1 ? first_size_
                                                          : static_cast<double>(options.cycle_second_step_size)),
        total_size_(first_size_ + second_size_),
        step_ratio_(first_size_ / total_size_),
        first_stairs_(options.cycle_first_stair_count),
        second_stairs_(options.cycle_second_stair_count == -1 ? options.cycle_first_stair_count
                                                              : options.cycle_second_stair_count),
        skip_lr_decay_(options.decay_step_size == 0 || options.decay_lr_rate == 0.0),
        skip_mom_decay_(options.decay_step_size == 0 || options.decay_mom_rate == 0.0) {}

  double lr_at(int64_t t) const override {
    if (t < 0) return options_.cycle_min_lr;  // set when built
    if (static_cast<double>(t) < total_size_) {
      return options_.cycle_min_lr + (options_.cycle_max_lr - options_.cycle_min_lr) * scale_factor(t);
    }
    if (skip_lr_decay_) return options_.cycle_min_lr;
    const double factor = 1.0 + options_.decay_lr_rate * decay_interval(t);
    return options_.cycle_min_lr / factor;
  }

  std::optional<Betas> betas_at(int64_t t) const override {
    if (!options_.cycle_momentum) return std::nullopt;
    return Betas{beta1_at(t), kOneCycleBeta2};
  }

 private:
  double beta1_at(int64_t t) const {
    // Set when built: the minimum, although the cycle's formula starts at the maximum (DeepSpeed's
    // _initialize_momentum against its _get_cycle_mom).
    if (t < 0) return options_.cycle_min_mom;
    if (static_cast<double>(t) < total_size_) {
      return options_.cycle_max_mom - (options_.cycle_max_mom - options_.cycle_min_mom) * scale_factor(t);
    }
    if (skip_mom_decay_) return options_.cycle_max_mom;
    // As DeepSpeed: the decay factor multiplies the max momentum (a positive rate raises it).
    return options_.cycle_max_mom * (1.0 + options_.decay_mom_rate * decay_interval(t));
  }

  // Position in the triangle: 0 at both ends of the cycle, 1 at its peak (DeepSpeed's _get_scale_factor).
  double scale_factor(int64_t t) const {
    const int64_t batch_iteration = t + 1;
    const double cycle = std::floor(1.0 + static_cast<double>(batch_iteration) / total_size_);
    const double x = 1.0 + static_cast<double>(batch_iteration) / total_size_ - cycle;
    const bool rising = x <= step_ratio_;
    const double scale = rising ? x / step_ratio_ : (x - 1.0) / (step_ratio_ - 1.0);
    const int64_t stairs = rising ? first_stairs_ : second_stairs_;
    if (stairs <= 0) return scale;
    // Stairs are counted from the integer position in the cycle, not from `scale`: at a half's end the float scale
    // can fall just below a whole stair, and flooring it would drop a stair (DeepSpeed's reasoning, kept).
    const double in_cycle = std::fmod(static_cast<double>(batch_iteration), total_size_);
    const double n = static_cast<double>(stairs);
    const double position = in_cycle <= first_size_ ? in_cycle * n / first_size_ : (total_size_ - in_cycle) * n / second_size_;
    return std::floor(position) / n;
  }

  // Steps into the decay phase (1 at the first step after the cycle), in units of decay_step_size.
  double decay_interval(int64_t t) const {
    const double decay_iteration = static_cast<double>(t) - total_size_ + 1.0;
    return decay_iteration / static_cast<double>(options_.decay_step_size);
  }

  OneCycleOptions options_;
  double first_size_;   // steps rising
  double second_size_;  // steps falling (0 allowed: the cycle only rises)
  double total_size_;
  double step_ratio_;   // fraction of the cycle spent rising
  int64_t first_stairs_;
  int64_t second_stairs_;
  bool skip_lr_decay_;
  bool skip_mom_decay_;
};

}  // namespace

std::unique_ptr<LRSchedule> make_one_cycle(const OneCycleOptions& o) {
  require(o.cycle_min_lr >= 0.0, "cycle_min_lr", "must be >= 0", o.cycle_min_lr);
  require(o.cycle_max_lr >= 0.0, "cycle_max_lr", "must be >= 0", o.cycle_max_lr);
  require(o.decay_lr_rate >= 0.0, "decay_lr_rate", "must be >= 0", o.decay_lr_rate);
  require(o.cycle_first_step_size >= 1, "cycle_first_step_size", "must be >= 1", o.cycle_first_step_size);
  require(o.cycle_second_step_size >= -1, "cycle_second_step_size",
          "must be >= 0 (or omitted to equal cycle_first_step_size)", o.cycle_second_step_size);
  require(o.cycle_first_stair_count >= 0, "cycle_first_stair_count", "must be >= 0", o.cycle_first_stair_count);
  require(o.cycle_second_stair_count >= -1, "cycle_second_stair_count", "must be >= 0",
          o.cycle_second_stair_count);
  require(o.decay_step_size >= 0, "decay_step_size", "must be >= 0 (0 disables the decay)", o.decay_step_size);
  if (o.cycle_momentum) {
    require(o.cycle_min_mom >= 0.0 && o.cycle_min_mom < 1.0, "cycle_min_mom", "must be in [0, 1)",
            o.cycle_min_mom);
    require(o.cycle_max_mom >= 0.0 && o.cycle_max_mom < 1.0, "cycle_max_mom", "must be in [0, 1)",
            o.cycle_max_mom);
  }
  return std::make_unique<OneCycle>(o);
}

}  // namespace dscpp::detail
