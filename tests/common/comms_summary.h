// The bytes per op of the comms logger's summary in a rank's log ("[comms] summary" then rows of op, message size
// with its unit, count, ...): message size × count summed over an op's rows. Sizes are printed rounded, so the
// totals are approximate (to a few parts in a thousand).
#pragma once

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace dscpp::testing {

inline std::map<std::string, double> comms_bytes(const std::string& log) {
  std::map<std::string, double> out;
  std::istringstream in(log.substr(std::min(log.size(), log.find("[comms] summary"))));
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string op, unit;
    double size = 0, count = 0;
    if (!(fields >> op >> size >> unit >> count)) continue;
    const std::vector<std::string> units = {"B", "KB", "MB", "GB"};
    const auto at = std::find(units.begin(), units.end(), unit);
    if (at != units.end()) out[op] += size * std::pow(1024.0, static_cast<double>(at - units.begin())) * count;
  }
  return out;
}

}  // namespace dscpp::testing
