// parse_count: "124M" / "1.5B" / "1.5e9" → parameter counts for the CLI.
#include "count_arg.h"

#include <cctype>
#include <cmath>
#include <stdexcept>

namespace dscpp {

int64_t parse_count(const std::string& text) {
  const std::string error = "'" + text + "' is not a count: expected e.g. 124M, 1.5B, 350k or 1.5e9";
  if (text.empty()) throw std::invalid_argument(error);
  std::string number = text;
  double multiplier = 1.0;
  switch (std::tolower(static_cast<unsigned char>(text.back()))) {
    case 'k': multiplier = 1e3; break;
    case 'm': multiplier = 1e6; break;
    case 'b': case 'g': multiplier = 1e9; break;
    case 't': multiplier = 1e12; break;
    default: break;
  }
  if (multiplier != 1.0) number.pop_back();
  size_t used = 0;
  double value = 0.0;
  try {
    value = std::stod(number, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument(error);
  }
  if (used != number.size() || !std::isfinite(value) || value < 0) throw std::invalid_argument(error);
  const double count = value * multiplier;
  if (std::fabs(count - std::round(count)) > 1e-6 * std::max(1.0, count) || count > 9.2e18) {
    throw std::invalid_argument(error);
  }
  return static_cast<int64_t>(std::llround(count));
}

}  // namespace dscpp
