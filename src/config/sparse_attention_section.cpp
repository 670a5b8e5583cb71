// "sparse_attention": DeepSpeed's block-sparse attention section, read as its get_sparse_attention reads it (mode by
// mode, each mode's keys with DeepSpeed's defaults), and the SparsityConfig classes' checks.
#include "dscpp/config/sparse_attention.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "dscpp/config/config_error.h"
#include "dscpp/config/json_reader.h"

namespace dscpp {
namespace {

std::string str(int64_t n) { return std::to_string(n); }

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("sparse_attention: " + message);
}

void check_global_ranges(const SparsityConfig& c) {
  for (int64_t idx : c.global_block_indices) require(idx >= 0, "global_block_indices must be >= 0, got " + str(idx));
  if (!c.global_block_end_indices) return;
  const auto& ends = *c.global_block_end_indices;
  require(ends.size() == c.global_block_indices.size(),
          "global_block_end_indices has " + str(ends.size()) + " entries, global_block_indices " +
              str(c.global_block_indices.size()) + "; they must be as many");
  for (size_t i = 0; i < ends.size(); ++i) {
    require(c.global_block_indices[i] < ends[i], "global block start index " + str(c.global_block_indices[i]) +
                                                     " must be smaller than its end index " + str(ends[i]));
  }
}


}  // namespace

void SparsityConfig::validate() const {
  const std::vector<std::string> modes = {"dense", "fixed", "variable", "bigbird", "bslongformer", "local"};
  require(std::find(modes.begin(), modes.end(), mode) != modes.end(),
          "mode \"" + mode + "\" is not one of dense, fixed, variable, bigbird, bslongformer");
  require(num_heads >= 1, "num_heads must be >= 1, got " + str(num_heads));
  require(block >= 1, "block must be >= 1, got " + str(block));
  if (mode == "fixed") {
    require(num_local_blocks >= 1 && num_global_blocks >= 1, "num_local_blocks and num_global_blocks must be >= 1");
    require(num_local_blocks % num_global_blocks == 0, "the number of blocks in a local window, " +
                                                           str(num_local_blocks) + ", must be divisible by the " +
                                                           "number of global blocks, " + str(num_global_blocks));
    require(!(unidirectional && horizontal_global_attention),
            "horizontal_global_attention needs bidirectional attention");
    require(num_different_global_patterns >= 1, "num_different_global_patterns must be >= 1");
    require(num_different_global_patterns == 1 || different_layout_per_head,
            "num_different_global_patterns > 1 needs different_layout_per_head: true (one layout for all heads has "
            "one pattern)");
    require(num_different_global_patterns <= num_local_blocks / num_global_blocks,
            "num_different_global_patterns " + str(num_different_global_patterns) + " cannot exceed num_local_blocks / "
            "num_global_blocks = " + str(num_local_blocks) + " / " + str(num_global_blocks) + " = " +
            str(num_local_blocks / num_global_blocks));
  } else if (mode == "variable") {
    require(num_random_blocks >= 0, "num_random_blocks must be >= 0");
    require(!local_window_blocks.empty(), "local_window_blocks needs at least one window size");
    for (int64_t size : local_window_blocks) require(size >= 1, "local_window_blocks must be >= 1, got " + str(size));
    require(!(unidirectional && horizontal_global_attention),
            "horizontal_global_attention needs bidirectional attention");
    check_global_ranges(*this);
  } else if (mode == "bigbird") {
    require(num_random_blocks >= 0 && num_global_blocks >= 0 && num_sliding_window_blocks >= 1,
            "num_random_blocks and num_global_blocks must be >= 0, num_sliding_window_blocks >= 1");
  } else if (mode == "bslongformer") {
    require(num_sliding_window_blocks >= 1, "num_sliding_window_blocks must be >= 1");
    check_global_ranges(*this);
  } else if (mode == "local") {
    require(num_sliding_window_blocks >= 1, "num_sliding_window_blocks must be >= 1");
    require(!different_layout_per_head, "the local layout has one layout for all heads");
  }
}

namespace {

std::vector<int64_t> int_list(JsonReader& section, const std::string& key, std::vector<int64_t> def) {
  const nlohmann::json* value = section.raw(key);
  if (value == nullptr) return def;
  const std::string what = "a list of block indices (integers >= 0)";
  if (!value->is_array()) section.fail(key, what);
  std::vector<int64_t> out;
  for (const auto& item : *value) {
    if (!item.is_number_integer() || item.get<int64_t>() < 0) section.fail(key, what);
    out.push_back(item.get<int64_t>());
  }
  return out;
}

}  // namespace

SparsityConfig parse_sparse_attention(JsonReader& section) {
  SparsityConfig c;
  c.mode = section.get_choice("mode", "fixed", {"dense", "fixed", "variable", "bigbird", "bslongformer"});
  // The keys each mode reads (DeepSpeed's get_sparse_<mode>_config), "attention" added where the class takes it.
  static const std::map<std::string, std::vector<std::string>> keys = {
      {"dense", {"block"}},
      {"fixed", {"block", "different_layout_per_head", "num_local_blocks", "num_global_blocks", "attention",
                 "horizontal_global_attention", "num_different_global_patterns"}},
      {"variable", {"block", "different_layout_per_head", "num_random_blocks", "local_window_blocks",
                    "global_block_indices", "global_block_end_indices", "attention", "horizontal_global_attention"}},
      {"bigbird", {"block", "different_layout_per_head", "num_random_blocks", "num_sliding_window_blocks",
                   "num_global_blocks", "attention"}},
      {"bslongformer", {"block", "different_layout_per_head", "num_sliding_window_blocks", "global_block_indices",
                        "global_block_end_indices", "attention"}},
  };
  const auto& mine = keys.at(c.mode);
  for (const std::string& key : section.keys()) {
    if (key != "mode" && std::find(mine.begin(), mine.end(), key) == mine.end()) {
      std::string allowed;
      for (const auto& k : mine) allowed += (allowed.empty() ? "" : ", ") + k;
      throw ConfigError("sparse_attention." + key + ": not a key of mode \"" + c.mode + "\" (it reads " + allowed +
                        "); remove it or choose the mode that has it");
    }
  }
  auto has = [&](const std::string& key) { return std::find(mine.begin(), mine.end(), key) != mine.end(); };
  c.block = section.get_int("block", 16, 1);
  if (has("different_layout_per_head")) c.different_layout_per_head = section.get_bool("different_layout_per_head", false);
  if (has("attention")) {
    c.unidirectional = section.get_choice("attention", "bidirectional", {"bidirectional", "unidirectional"}) ==
                       "unidirectional";
  }
  if (has("num_local_blocks")) c.num_local_blocks = section.get_int("num_local_blocks", 4, 1);
  if (has("num_global_blocks")) c.num_global_blocks = section.get_int("num_global_blocks", 1, c.mode == "fixed" ? 1 : 0);
  if (has("horizontal_global_attention")) {
    c.horizontal_global_attention = section.get_bool("horizontal_global_attention", false);
  }
  if (has("num_different_global_patterns")) {
    c.num_different_global_patterns = section.get_int("num_different_global_patterns", 1, 1);
  }
  if (has("num_random_blocks")) c.num_random_blocks = section.get_int("num_random_blocks", 0, 0);
  if (has("local_window_blocks")) c.local_window_blocks = int_list(section, "local_window_blocks", {4});
  if (has("global_block_indices")) c.global_block_indices = int_list(section, "global_block_indices", {0});
  if (has("global_block_end_indices") && section.raw("global_block_end_indices") != nullptr &&
      !section.raw("global_block_end_indices")->is_null()) {
    c.global_block_end_indices = int_list(section, "global_block_end_indices", {});
  }
  if (has("num_sliding_window_blocks")) c.num_sliding_window_blocks = section.get_int("num_sliding_window_blocks", 3, 1);
  section.finish();
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
  return c;
}

}  // namespace dscpp
