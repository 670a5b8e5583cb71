// TensorSlice: where a model-parallel rank's tensor sits in the whole parameter. A tensor-parallel layer holds, under
// the whole parameter's name, the concatenation along one dimension of some ranges of that dimension: a column-
// parallel weight one range of its rows, Megatron's fused q/k/v weight one range of each of its three blocks, a
// row-parallel weight one range of its columns. Checkpoints record the slice with each fragment the rank writes, so
// the fragments stay parts of the whole named parameter: a reader of any other layout (one process, another
// tensor-parallel size) assembles the whole parameter and takes its own slice of it, and `dscpp consolidate` writes
// the whole one (what DeepSpeed needs its universal-checkpoint conversion for).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace dscpp {

struct TensorSlice {
  int64_t dim = 0;
  std::vector<int64_t> whole_shape;
  // Ranges [begin, begin + length) of dimension `dim` of the whole tensor; the slice is their concatenation, in order.
  std::vector<std::pair<int64_t, int64_t>> pieces;

  // Part `index` of `parts` equal parts of dimension `dim`, taken from each of `blocks` equal blocks of it (3 for a
  // fused [q; k; v] weight, 1 otherwise). std::invalid_argument naming the numbers when they do not divide.
  static TensorSlice part(std::vector<int64_t> whole_shape, int64_t dim, int parts, int index, int blocks = 1);

  std::vector<int64_t> shape() const;  // the slice's own shape
  int64_t numel() const;
  int64_t whole_numel() const;
  // The slice of `whole` (whole_shape), contiguous.
  torch::Tensor take(const torch::Tensor& whole) const;
  // Writes `local` (shape(), or flat with numel()) into its place in `whole` (whole_shape).
  void put(const torch::Tensor& local, torch::Tensor& whole) const;

  nlohmann::json to_json() const;
  // Throws std::invalid_argument saying what is wrong (a dim outside the shape, a piece outside the dimension).
  static TensorSlice from_json(const nlohmann::json& json);
  bool operator==(const TensorSlice& other) const {
    return dim == other.dim && whole_shape == other.whole_shape && pieces == other.pieces;
  }
  bool operator!=(const TensorSlice& other) const { return !(*this == other); }
};

}  // namespace dscpp
