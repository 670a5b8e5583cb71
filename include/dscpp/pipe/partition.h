// How a pipeline model's layers are split over its stages: DeepSpeed's PipelineModule partition_method.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dscpp {

// What partitioning needs to know of a layer.
struct LayerInfo {
  std::string type;    // the layer's class ("Block"), matched by "type:REGEX"
  int64_t params = 0;  // its trainable parameters' elements (a tied module counts in every layer that uses it)
};

// Stage boundaries: stage s runs layers [parts[s], parts[s + 1]); parts.size() == stages + 1, parts[0] == 0,
// parts[stages] == layers.size(), every stage at least one layer. `method`:
//   "parameters" — contiguous stages whose largest parameter count is as small as it can be (DeepSpeed's default);
//   "uniform"    — the same number of layers per stage, the first stages one more where it does not divide;
//   "type:REGEX" — balance the number of layers whose type matches REGEX (case-insensitive, anywhere in the name),
//                  e.g. "type:Block" puts the same number of transformer blocks on each stage.
// std::invalid_argument naming the numbers for more stages than layers, an unknown method, a bad or unmatched regex.
std::vector<int> partition_layers(const std::vector<LayerInfo>& layers, int stages, const std::string& method);

// The contiguous split of `weights` into `parts` non-empty runs whose largest sum is smallest (ties: later runs as
// long as they can be). DeepSpeed's partition_balanced.
std::vector<int> partition_balanced(const std::vector<int64_t>& weights, int parts);
// DeepSpeed's partition_uniform over `items` items (parts > items is an error here: every stage needs a layer).
std::vector<int> partition_uniform(int items, int parts);

}  // namespace dscpp
