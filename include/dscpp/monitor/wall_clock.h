// WallClock ("wall_clock_breakdown"): where training time goes, in DeepSpeed's timer names. forward;
// backward, split into backward_inner (autograd, with the bucket reductions it launches) and backward_allreduce (the
// time spent waiting for gradient reduction: the end of each micro-step's backward and the boundary's reduction);
// step (clip, optimizer, publishing the parameters). Summed per optimizer step and over the print window.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace dscpp {

enum class Phase { kForward, kBackward, kBackwardInner, kBackwardAllreduce, kStep };
constexpr size_t kPhases = 5;
// "fwd", "bwd", "bwd_inner", "bwd_allreduce", "step".
const char* phase_name(Phase phase);

// Seconds per phase, and how many micro-steps and optimizer steps they cover.
struct PhaseTimes {
  std::array<double, kPhases> seconds{};
  int64_t micro_steps = 0;
  int64_t steps = 0;

  double& operator[](Phase p) { return seconds[static_cast<size_t>(p)]; }
  double operator[](Phase p) const { return seconds[static_cast<size_t>(p)]; }
  void add(const PhaseTimes& other);
};

// DeepSpeed's two lines in one, in milliseconds: per optimizer step and per micro-step, averaged over the window.
// "time (ms) | fwd: 12.30 | bwd: 30.10 | bwd_inner: 25.00 | bwd_allreduce: 5.10 | step: 4.20 | fwd_microstep: 6.15 |
//  bwd_microstep: 15.05 | bwd_inner_microstep: 12.50 | bwd_allreduce_microstep: 2.55 | step_microstep: 2.10"
std::string format_wall_clock(const PhaseTimes& window);

}  // namespace dscpp
