// FlatLayout: packing parameters into groups and sharding each group evenly over ranks.
#include "dscpp/zero/flat_layout.h"

#include <algorithm>
#include <stdexcept>

namespace dscpp {
namespace {

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

FlatLayout::FlatLayout(const std::vector<Param>& params, int world_size, int64_t group_numel, int expert_parallel)
    : world_size_(world_size), expert_parallel_(expert_parallel) {
  if (world_size < 1) throw std::invalid_argument("FlatLayout: world_size must be >= 1, got " + std::to_string(world_size));
  if (group_numel < 1) throw std::invalid_argument("FlatLayout: group_numel must be >= 1, got " + std::to_string(group_numel));
  if (expert_parallel < 1 || world_size % expert_parallel != 0) {
    throw std::invalid_argument("FlatLayout: expert parallel size " + std::to_string(expert_parallel) +
                                " must divide the world size " + std::to_string(world_size));
  }
  slots_.reserve(params.size());
  ParamGroup open;  // the group being filled
  int64_t open_used = 0;
  auto close_group = [&](int end) {
    open.param_end = end;
    open.shards = open.expert ? world_size / expert_parallel : world_size;
    open.numel = round_up(std::max<int64_t>(open_used, 1), open.shards);
    open.shard_numel = open.numel / open.shards;
    open.partition_offset = partition_numel_;
    padded_numel_ += open.numel;
    partition_numel_ += open.shard_numel;
    groups_.push_back(open);
    open = ParamGroup{};
    open.offset = padded_numel_;
    open.param_begin = end;
    open_used = 0;
  };
  for (size_t i = 0; i < params.size(); ++i) {
    int64_t numel = 1;
    for (int64_t d : params[i].shape) numel *= d;
    const bool open_has_params = static_cast<int>(i) > open.param_begin;
    if ((open_has_params && (params[i].starts_group || params[i].expert != open.expert)) ||
        (open_used > 0 && open_used + numel > group_numel)) {
      close_group(static_cast<int>(i));
    }
    open.expert = params[i].expert;
    slots_.push_back(ParamSlot{params[i].name, params[i].shape, open.offset + open_used, numel,
                               static_cast<int>(groups_.size())});
    open_used += numel;
    numel_ += numel;
  }
  if (static_cast<int>(params.size()) > open.param_begin || groups_.empty()) close_group(static_cast<int>(params.size()));
}

int FlatLayout::shard_index(int group, int rank) const {
  if (group < 0 || group >= static_cast<int>(groups_.size()) || rank < 0 || rank >= world_size_) {
    throw std::out_of_range("FlatLayout: group " + std::to_string(group) + " rank " +
                            std::to_string(rank) + " outside " + std::to_string(groups_.size()) + " groups x " +
                            std::to_string(world_size_) + " ranks");
  }
  return groups_[group].expert ? rank / expert_parallel_ : rank;
}

int64_t FlatLayout::shard_offset(int group, int rank) const {
  const int shard = shard_index(group, rank);  // checks both
  const auto& g = groups_[group];
  return g.offset + shard * g.shard_numel;
}

std::optional<ShardFragment> FlatLayout::fragment_of(int slot, int rank) const {
  const auto& s = slots_[slot];
  const int64_t begin = shard_offset(s.group, rank), end = begin + groups_[s.group].shard_numel;
  const int64_t lo = std::max(begin, s.offset), hi = std::min(end, s.offset + s.numel);
  if (lo >= hi) return std::nullopt;
  return ShardFragment{slot, lo - s.offset, hi - lo, lo};
}

int64_t FlatLayout::partition_offset(const ShardFragment& fragment, int rank) const {
  const int group = slots_[fragment.slot].group;
  return groups_[group].partition_offset + (fragment.flat_offset - shard_offset(group, rank));
}

std::vector<ShardFragment> FlatLayout::shard_fragments(int rank) const {
  std::vector<ShardFragment> out;
  for (int g = 0; g < static_cast<int>(groups_.size()); ++g) {
    const int64_t begin = shard_offset(g, rank);
    const int64_t end = begin + groups_[g].shard_numel;
    for (int i = groups_[g].param_begin; i < groups_[g].param_end; ++i) {
      const auto& slot = slots_[i];
      const int64_t lo = std::max(begin, slot.offset);
      const int64_t hi = std::min(end, slot.offset + slot.numel);
      if (lo < hi) out.push_back(ShardFragment{i, lo - slot.offset, hi - lo, lo});
    }
  }
  return out;
}

}  // namespace dscpp
