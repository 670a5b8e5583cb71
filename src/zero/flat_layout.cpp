// FlatLayout: packing parameters into one buffer and splitting it into equal rank partitions.
#include "dscpp/zero/flat_layout.h"

#include <stdexcept>

namespace dscpp {
namespace {

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

FlatLayout::FlatLayout(const std::vector<Param>& params, int world_size, int64_t alignment)
    : world_size_(world_size) {
  if (world_size < 1) throw std::invalid_argument("FlatLayout: world_size must be >= 1, got " + std::to_string(world_size));
  if (alignment < 1) throw std::invalid_argument("FlatLayout: alignment must be >= 1, got " + std::to_string(alignment));
  int64_t offset = 0;
  slots_.reserve(params.size());
  for (const auto& p : params) {
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    offset = round_up(offset, alignment);
    slots_.push_back(ParamSlot{p.name, p.shape, offset, numel});
    offset += numel;
    numel_ += numel;
  }
  padded_numel_ = round_up(std::max<int64_t>(offset, 1), alignment * world_size);
}

Range FlatLayout::partition(int rank) const {
  if (rank < 0 || rank >= world_size_) {
    throw std::out_of_range("FlatLayout::partition: rank " + std::to_string(rank) + " outside [0, " +
                            std::to_string(world_size_) + ")");
  }
  const int64_t size = partition_numel();
  return Range{rank * size, (rank + 1) * size};
}

}  // namespace dscpp
