// TrainingProgress: where training stands, as DeepSpeed counts it. The engine advances it each step; checkpoints
// save and restore it (and with it the LR schedule's position).
#pragma once

#include <cstdint>

namespace dscpp {

struct TrainingProgress {
  int64_t micro_steps = 0;     // backward/step pairs so far
  int64_t global_steps = 0;    // optimizer boundaries so far, skipped ones included (DeepSpeed's global_steps)
  int64_t skipped_steps = 0;   // boundaries skipped for overflow
  int64_t global_samples = 0;  // samples consumed: global batch × boundaries
  // The LR schedule's position: the steps applied since the schedule started. global_steps − skipped_steps, unless a
  // checkpoint was loaded without its scheduler state (the schedule then counts from where this run's stood, as a
  // DeepSpeed scheduler that is not loaded does).
  int64_t schedule_steps = 0;
};

}  // namespace dscpp
