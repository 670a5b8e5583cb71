// partition_layers: DeepSpeed's partition methods over a pipeline model's layers.
#include "dscpp/pipe/partition.h"

#include <algorithm>
#include <limits>
#include <regex>
#include <stdexcept>

namespace dscpp {
namespace {

void check_counts(int items, int parts) {
  if (parts < 1) throw std::invalid_argument("pipeline: " + std::to_string(parts) + " stages; need at least 1");
  if (items < parts) {
    throw std::invalid_argument("pipeline: " + std::to_string(parts) + " stages but the model has " +
                                std::to_string(items) + " layers: every stage needs at least one layer");
  }
}

}  // namespace

std::vector<int> partition_uniform(int items, int parts) {
  check_counts(items, parts);
  std::vector<int> out(parts + 1, 0);
  const int chunk = items / parts, extra = items % parts;
  for (int p = 0; p < parts; ++p) out[p + 1] = out[p] + chunk + (p < extra ? 1 : 0);
  return out;
}

std::vector<int> partition_balanced(const std::vector<int64_t>& weights, int parts) {
  const int n = static_cast<int>(weights.size());
  check_counts(n, parts);
  std::vector<int64_t> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + weights[i];
  // best[k][i]: the smallest largest-sum splitting the first i items into k runs; from[k][i]: where the last begins.
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(parts + 1, std::vector<int64_t>(n + 1, kInf));
  std::vector<std::vector<int>> from(parts + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= parts; ++k) {
    for (int i = k; i <= n - (parts - k); ++i) {
      for (int j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == kInf) continue;
        const int64_t cost = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (cost < best[k][i]) best[k][i] = cost, from[k][i] = j;
      }
    }
  }
  std::vector<int> out(parts + 1, 0);
  out[parts] = n;
  for (int k = parts; k > 0; --k) out[k - 1] = from[k][out[k]];
  return out;
}

std::vector<int> partition_layers(const std::vector<LayerInfo>& layers, int stages, const std::string& method) {
  const int n = static_cast<int>(layers.size());
  if (method == "uniform") return partition_uniform(n, stages);
  std::vector<int64_t> weights;
  if (method == "parameters") {
    for (const auto& layer : layers) weights.push_back(layer.params);
  } else if (method.rfind("type:", 0) == 0) {
    const std::string pattern = method.substr(5);
    std::regex regex;
    try {
      regex = std::regex(pattern, std::regex::icase);
    } catch (const std::regex_error& e) {
      throw std::invalid_argument("pipeline partition method '" + method + "': '" + pattern +
                                  "' is not a regular expression (" + e.what() + ")");
    }
    int matched = 0;
    for (const auto& layer : layers) {
      const bool match = std::regex_search(layer.type, regex);
      weights.push_back(match ? 1 : 0);
      matched += match ? 1 : 0;
    }
    if (matched == 0) {
      std::string types;
      for (const auto& layer : layers) {
        const std::string quoted = "'" + layer.type + "'";
        if (types.find(quoted) == std::string::npos) types += (types.empty() ? "" : ", ") + quoted;
      }
      throw std::invalid_argument("pipeline partition method '" + method + "' matches none of the layer types (" +
                                  types + ")");
    }
  } else {
    throw std::invalid_argument("pipeline partition method '" + method +
                                "' is not one of: parameters, uniform, type:REGEX");
  }
  return partition_balanced(weights, stages);
}

}  // namespace dscpp
