// OneCycle (DeepSpeed's 1Cycle policy): lr rises from cycle_min_lr to cycle_max_lr over the first step size,
// falls back over the second, then decays; momentum (beta1) moves the opposite way.
// DeepSpeed parses cycle_first/second_stair_count but never applies them; we accept and ignore them too,
// so a config gives the lr sequence its users already know.
#include <algorithm>
#include <cmath>
#include <optional>

#include "schedules.h"

namespace dscpp::detail {
namespace {

class OneCycle final : public LRSchedule {
 public:
  explicit OneCycle(const OneCycleOptions& options)
      : options_(options),
        total_size_(static_cast<double>(options.cycle_first_step_size) +
                    static_cast<double>(options.cycle_second_step_size == -1 ? options.cycle_first_step_size
                                                                             : options.cycle_second_step_size)),
        step_ratio_(static_cast<double>(options.cycle_first_step_size) / total_size_),
        skip_lr_decay_(options.decay_step_size == 0 || options.decay_lr_rate == 0.0),
        skip_mom_decay_(options.decay_step_size == 0 || options.decay_mom_rate == 0.0) {}

  double lr_at(int64_t t) const override {
    t = std::max<int64_t>(t, 0);
    if (static_cast<double>(t) < total_size_) {
      return options_.cycle_min_lr + (options_.cycle_max_lr - options_.cycle_min_lr) * scale_factor(t);
    }
    if (skip_lr_decay_) return options_.cycle_min_lr;
    const double factor = 1.0 + options_.decay_lr_rate * decay_interval(t);
    return options_.cycle_min_lr / factor;
  }

  std::optional<double> momentum_at(int64_t t) const override {
    if (!options_.cycle_momentum) return std::nullopt;
    t = std::max<int64_t>(t, 0);
    if (static_cast<double>(t) < total_size_) {
      return options_.cycle_max_mom - (options_.cycle_max_mom - options_.cycle_min_mom) * scale_factor(t);
    }
    if (skip_mom_decay_) return options_.cycle_max_mom;
    // As DeepSpeed: the decay factor multiplies the max momentum (a positive rate raises it).
    return options_.cycle_max_mom * (1.0 + options_.decay_mom_rate * decay_interval(t));
  }

 private:
  // Position in the triangle: 0 at both ends of the cycle, 1 at its peak (DeepSpeed's _get_scale_factor).
  double scale_factor(int64_t t) const {
    const double batch_iteration = static_cast<double>(t + 1);
    const double cycle = std::floor(1.0 + batch_iteration / total_size_);
    const double x = 1.0 + batch_iteration / total_size_ - cycle;
    return x <= step_ratio_ ? x / step_ratio_ : (x - 1.0) / (step_ratio_ - 1.0);
  }

  // Steps into the decay phase (1 at the first step after the cycle), in units of decay_step_size.
  double decay_interval(int64_t t) const {
    const double decay_iteration = static_cast<double>(t) - total_size_ + 1.0;
    return decay_iteration / static_cast<double>(options_.decay_step_size);
  }

  OneCycleOptions options_;
  double total_size_;   // steps in the cycle (first + second step size)
  double step_ratio_;   // fraction of the cycle spent rising
  bool skip_lr_decay_;
  bool skip_mom_decay_;
};

}  // namespace

std::unique_ptr<LRSchedule> make_one_cycle(const OneCycleOptions& o) {
  require(o.cycle_min_lr >= 0.0, "cycle_min_lr", "must be >= 0", o.cycle_min_lr);
  require(o.cycle_max_lr >= 0.0, "cycle_max_lr", "must be >= 0", o.cycle_max_lr);
  require(o.decay_lr_rate >= 0.0, "decay_lr_rate", "must be >= 0", o.decay_lr_rate);
  require(o.cycle_first_step_size >= 1, "cycle_first_step_size", "must be >= 1", o.cycle_first_step_size);
  require(o.cycle_second_step_size == -1 || o.cycle_second_step_size >= 1, "cycle_second_step_size",
          "must be >= 1 (or omitted to equal cycle_first_step_size)", o.cycle_second_step_size);
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
