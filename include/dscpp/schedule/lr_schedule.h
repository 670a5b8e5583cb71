// LRSchedule: the learning rate as a pure function of how many optimizer steps have been taken.
// Stateless by design, so a checkpoint only needs the step count and resume is exact.
//
// The sequence is DeepSpeed's (runtime/lr_schedules.py, 0.16 and later): a schedule sets its "iteration -1" value on
// the optimizer when it is built, and the engine advances it once after each applied optimizer step. So optimizer
// step k (1, 2, ...) runs at lr_at(k - 2): the first step at the value set when built, the second at iteration 0's.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "dscpp/schedule/options.h"

namespace dscpp {

struct Betas {
  double beta1;
  double beta2;
};

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;

  // DeepSpeed's get_lr() with last_batch_iteration = `iteration`; iteration -1 (or below) is the value the schedule
  // sets when built. After s applied steps the next step runs at lr_at(s - 1).
  virtual double lr_at(int64_t iteration) const = 0;

  // The optimizer's betas at `iteration`, for schedules that cycle momentum (OneCycle); nullopt leaves them alone.
  // Both betas, because DeepSpeed's OneCycle writes the pair (cycled beta1, 0.99) into each param group.
  virtual std::optional<Betas> betas_at(int64_t iteration) const { return std::nullopt; }
};

// A schedule that always returns the optimizer's base lr: used when the config has no "scheduler".
class ConstantLR final : public LRSchedule {
 public:
  explicit ConstantLR(double lr) : lr_(lr) {}
  double lr_at(int64_t) const override { return lr_; }

 private:
  double lr_;
};

// Builds the schedule named by `config`. `base_lr` is the optimizer's lr (WarmupCosineLR scales it; WarmupLR without
// warmup_max_lr warms up to it).
// Throws std::invalid_argument naming the key for values the schedule cannot use.
std::unique_ptr<LRSchedule> make_lr_schedule(const SchedulerConfig& config, double base_lr);

}  // namespace dscpp
