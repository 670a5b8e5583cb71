// WallClock: phase names and the printed line.
#include "dscpp/monitor/wall_clock.h"

#include <cstdio>

namespace dscpp {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kForward: return "fwd";
    case Phase::kBackward: return "bwd";
    case Phase::kBackwardInner: return "bwd_inner";
    case Phase::kBackwardAllreduce: return "bwd_allreduce";
    case Phase::kStep: return "step";
  }
  return "?";
}

void PhaseTimes::add(const PhaseTimes& other) {
  for (size_t i = 0; i < kPhases; ++i) seconds[i] += other.seconds[i];
  micro_steps += other.micro_steps;
  steps += other.steps;
}

std::string format_wall_clock(const PhaseTimes& window) {
  std::string line = "time (ms)";
  char field[96];
  auto append = [&](const char* suffix, int64_t count) {
    for (size_t i = 0; i < kPhases; ++i) {
      const double ms = count > 0 ? window.seconds[i] * 1e3 / static_cast<double>(count) : 0.0;
      std::snprintf(field, sizeof field, " | %s%s: %.2f", phase_name(static_cast<Phase>(i)), suffix, ms);
      line += field;
    }
  };
  append("", window.steps);
  append("_microstep", window.micro_steps);
  return line;
}

}  // namespace dscpp
