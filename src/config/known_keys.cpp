// Closest-key suggestions: Levenshtein among siblings, then substring, then the same key at another level.
#include "dscpp/config/known_keys.h"

#include <algorithm>

namespace dscpp {

size_t levenshtein(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::optional<std::string> suggest_key(const std::string& key, const std::string& parent_path,
                                       const std::vector<std::string>& siblings,
                                       const std::vector<std::string>& all_paths) {
  const std::string prefix = parent_path.empty() ? "" : parent_path + ".";
  // A sibling that contains it: a shortened name (DeepSpeed's pydantic field names drop the "stage3_" prefix).
  // Checked first: sharing a long whole name says more than a small edit distance.
  if (key.size() >= 8) {
    for (const auto& candidate : siblings) {
      if (candidate.find(key) != std::string::npos) return prefix + candidate;
    }
  }
  // A close sibling: the usual typo.
  const size_t threshold = std::max<size_t>(2, key.size() / 3);
  std::optional<std::string> best;
  size_t best_distance = threshold + 1;
  for (const auto& candidate : siblings) {
    size_t d = levenshtein(key, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  if (best) return prefix + *best;
  // The same key (or a close one) at another level: a key put in the wrong section.
  best_distance = std::min<size_t>(2, key.size() / 4) + 1;
  for (const auto& path : all_paths) {
    std::string leaf = path.substr(path.rfind('.') == std::string::npos ? 0 : path.rfind('.') + 1);
    size_t d = levenshtein(key, leaf);
    if (d < best_distance && path != prefix + leaf) {
      best_distance = d;
      best = path;
    }
  }
  return best;
}

}  // namespace dscpp
