// Closest-key suggestions for unknown config keys (typos are the #1 silent failure of DeepSpeed configs).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dscpp {

// Edit distance (insertions, deletions, substitutions) between two keys.
size_t levenshtein(const std::string& a, const std::string& b);

// The best suggestion for `key`, found unknown under `parent_path`, as a full dotted path: first a sibling
// containing it (a shortened name: "prefetch_bucket_size" -> "stage3_prefetch_bucket_size"), then the closest
// sibling within edit distance max(2, len/3) (a typo), then the same key known at another level (wrong section).
std::optional<std::string> suggest_key(const std::string& key, const std::string& parent_path,
                                       const std::vector<std::string>& siblings,
                                       const std::vector<std::string>& all_paths);

}  // namespace dscpp
