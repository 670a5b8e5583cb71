// ZeroStage's addressing of the master partition, which every stage describes through its layout.
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

std::vector<ShardFragment> ZeroStage::master_fragments(int rank) const {
  const auto& flat = layout();
  if (!master_is_whole()) return flat.shard_fragments(rank);
  std::vector<ShardFragment> out;
  for (int i = 0; i < static_cast<int>(flat.slots().size()); ++i) {
    const auto& slot = flat.slots()[i];
    out.push_back({i, 0, slot.numel, slot.offset});
  }
  return out;
}

int64_t ZeroStage::master_offset(const ShardFragment& fragment, int rank) const {
  if (master_is_whole()) return fragment.flat_offset;
  const auto& flat = layout();
  const int group = flat.slots()[fragment.slot].group;
  return flat.groups()[group].partition_offset + (fragment.flat_offset - flat.shard_offset(group, rank));
}

}  // namespace dscpp
