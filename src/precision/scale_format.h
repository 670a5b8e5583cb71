// Private helper for the scalers' messages: prints a loss scale the way a user reads it
// (65536, not 65536.000000; fractional scales keep their digits).
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace dscpp::detail {

inline std::string format_scale(double scale) {
  char buf[64];
  if (std::isfinite(scale) && scale == std::floor(scale) && std::fabs(scale) < 1e18) {
    std::snprintf(buf, sizeof(buf), "%.0f", scale);
  } else {
    std::snprintf(buf, sizeof(buf), "%.9g", scale);
  }
  return buf;
}

}  // namespace dscpp::detail
