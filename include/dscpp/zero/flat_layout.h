// FlatLayout: where each parameter lives in one flat buffer, and how that buffer splits into equal rank partitions.
// Pure arithmetic (no tensors), so every stage, the checkpoint writer and the memory planner agree on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dscpp {

struct ParamSlot {
  std::string name;             // the module's parameter name, e.g. "h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0;           // first element in the flat buffer
  int64_t numel = 0;
};

// [begin, end) of rank `rank`'s partition of a buffer of `padded_numel` elements split `world_size` ways.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

class FlatLayout {
 public:
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
  };

  // Params are packed in order, each starting at a multiple of `alignment` elements; the total is padded to a
  // multiple of world_size × alignment so every rank's partition has the same size and starts aligned.
  FlatLayout(const std::vector<Param>& params, int world_size, int64_t alignment = 1);

  const std::vector<ParamSlot>& slots() const { return slots_; }
  int world_size() const { return world_size_; }
  int64_t numel() const { return numel_; }                 // sum of parameter sizes, no padding
  int64_t padded_numel() const { return padded_numel_; }   // flat buffer size
  int64_t partition_numel() const { return padded_numel_ / world_size_; }
  Range partition(int rank) const;

 private:
  std::vector<ParamSlot> slots_;
  int world_size_;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
};

}  // namespace dscpp
