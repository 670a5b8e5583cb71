// Private to src/schedule: one constructor function per schedule (each validates its own options) and the
// warmup curve that WarmupLR, WarmupDecayLR and WarmupCosineLR share.
#pragma once

#include <cstdint>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dscpp/schedule/lr_schedule.h"
#include "dscpp/schedule/options.h"

namespace dscpp::detail {

// DeepSpeed clamps warmup_num_steps to >= 2 so that ln(N) > 0.
inline int64_t effective_warmup_steps(int64_t warmup_num_steps) {
  return warmup_num_steps < 2 ? 2 : warmup_num_steps;
}

// Warmup progress in [0, 1) for t < n (n already clamped): ln(t+1)/ln(n) or t/n.
double warmup_gamma(int64_t t, int64_t n, WarmupType type);

// Throws std::invalid_argument "scheduler.params.<key> <requirement>, got <value>" unless `ok`.
template <typename T>
void require(bool ok, const char* key, const char* requirement, T value) {
  if (ok) return;
  std::ostringstream msg;
  msg << "scheduler.params." << key << ' ' << requirement << ", got " << value;
  throw std::invalid_argument(msg.str());
}

// Checks the warmup keys WarmupLR and WarmupDecayLR share.
void validate_warmup(const WarmupLROptions& options);

std::unique_ptr<LRSchedule> make_warmup_lr(const WarmupLROptions& options, double base_lr);
std::unique_ptr<LRSchedule> make_warmup_decay_lr(const WarmupDecayLROptions& options);
std::unique_ptr<LRSchedule> make_warmup_cosine_lr(const WarmupCosineLROptions& options, double base_lr);
std::unique_ptr<LRSchedule> make_one_cycle(const OneCycleOptions& options);
std::unique_ptr<LRSchedule> make_lr_range_test(const LRRangeTestOptions& options);

}  // namespace dscpp::detail
