// LRRangeTest: lr = min_lr * (1 + step_rate * interval), interval = (t+1)/step_size, floored in staircase mode.
// Used to find the largest lr that still trains before setting OneCycle's bounds.
#include <algorithm>
#include <cmath>

#include "schedules.h"

namespace dscpp::detail {
namespace {

class LRRangeTest final : public LRSchedule {
 public:
  explicit LRRangeTest(const LRRangeTestOptions& options) : options_(options) {}

  double lr_at(int64_t t) const override {
    t = std::max<int64_t>(t, -1);  // -1: the value set when built, min_lr
    const double steps = static_cast<double>(t + 1) / static_cast<double>(options_.lr_range_test_step_size);
    const double interval = options_.lr_range_test_staircase ? std::floor(steps) : steps;
    return options_.lr_range_test_min_lr * (1.0 + options_.lr_range_test_step_rate * interval);
  }

 private:
  LRRangeTestOptions options_;
};

}  // namespace

std::unique_ptr<LRSchedule> make_lr_range_test(const LRRangeTestOptions& o) {
  require(o.lr_range_test_min_lr >= 0.0, "lr_range_test_min_lr", "must be >= 0", o.lr_range_test_min_lr);
  require(o.lr_range_test_step_size >= 1, "lr_range_test_step_size", "must be >= 1", o.lr_range_test_step_size);
  require(o.lr_range_test_step_rate >= 0.0, "lr_range_test_step_rate", "must be >= 0", o.lr_range_test_step_rate);
  return std::make_unique<LRRangeTest>(o);
}

}  // namespace dscpp::detail
