// LRSchedule: the learning rate as a pure function of how many optimizer steps have been taken.
// Stateless by design, so a checkpoint only needs the step count and resume is exact.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "dscpp/schedule/options.h"

namespace dscpp {

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;

  // The lr for the optimizer step that follows `t` completed (non-skipped) steps: optimizer step k (1, 2, ...)
  // uses lr_at(k - 1). (DeepSpeed's first step uses the optimizer's base lr instead; we do not copy that quirk.)
  virtual double lr_at(int64_t t) const = 0;

  // The momentum (beta1 for Adam-like optimizers) at `t`, for schedules that cycle it (OneCycle);
  // nullopt leaves the optimizer's momentum alone.
  virtual std::optional<double> momentum_at(int64_t t) const { return std::nullopt; }
};

// A schedule that always returns the optimizer's base lr: used when the config has no "scheduler".
class ConstantLR final : public LRSchedule {
 public:
  explicit ConstantLR(double lr) : lr_(lr) {}
  double lr_at(int64_t) const override { return lr_; }

 private:
  double lr_;
};

// Builds the schedule named by `config`. `base_lr` is the optimizer's lr (WarmupCosineLR scales it).
// Throws std::invalid_argument naming the key for values the schedule cannot use.
std::unique_ptr<LRSchedule> make_lr_schedule(const SchedulerConfig& config, double base_lr);

}  // namespace dscpp
