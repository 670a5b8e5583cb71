// make_lr_schedule: picks the schedule for the config's "scheduler" section; each schedule validates its keys.
#include "dscpp/schedule/lr_schedule.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>

#include "schedules.h"

namespace dscpp {
namespace {

// The type name DeepSpeed uses for each options alternative.
template <typename T>
const char* schedule_name() {
  if constexpr (std::is_same_v<T, WarmupLROptions>) {
    return "WarmupLR";
  } else if constexpr (std::is_same_v<T, WarmupDecayLROptions>) {
    return "WarmupDecayLR";
  } else if constexpr (std::is_same_v<T, WarmupCosineLROptions>) {
    return "WarmupCosineLR";
  } else if constexpr (std::is_same_v<T, OneCycleOptions>) {
    return "OneCycle";
  } else {
    static_assert(std::is_same_v<T, LRRangeTestOptions>, "every scheduler alternative needs a name");
    return "LRRangeTest";
  }
}

bool same_name(const std::string& a, const std::string& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

std::unique_ptr<LRSchedule> make_lr_schedule(const SchedulerConfig& config, double base_lr) {
  return std::visit(
      [&](const auto& options) -> std::unique_ptr<LRSchedule> {
        using T = std::decay_t<decltype(options)>;
        // An empty type means "whatever the options are"; a mismatch is a bug in whoever filled the struct.
        if (!config.type.empty() && !same_name(config.type, schedule_name<T>())) {
          throw std::invalid_argument("scheduler.type \"" + config.type + "\" does not match its params (parsed as " +
                                      schedule_name<T>() +
                                      "); supported: WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest");
        }
        if constexpr (std::is_same_v<T, WarmupLROptions>) {
          return detail::make_warmup_lr(options, base_lr);
        } else if constexpr (std::is_same_v<T, WarmupDecayLROptions>) {
          return detail::make_warmup_decay_lr(options);
        } else if constexpr (std::is_same_v<T, WarmupCosineLROptions>) {
          return detail::make_warmup_cosine_lr(options, base_lr);
        } else if constexpr (std::is_same_v<T, OneCycleOptions>) {
          return detail::make_one_cycle(options);
        } else {
          return detail::make_lr_range_test(options);
        }
      },
      config.options);
}

}  // namespace dscpp
