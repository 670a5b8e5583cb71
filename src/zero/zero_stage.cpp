// ZeroStage's addressing of the master partition, which every stage describes through its layout.
#include "dscpp/zero/zero_stage.h"

#include "dscpp/zero/grad_norm.h"

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
  return master_is_whole() ? fragment.flat_offset : layout().partition_offset(fragment, rank);
}

// A rank's share is its shard of every group whatever the stage (stage 0 holds the whole gradient but counts only
// its shard, so that shares are disjoint), found in master_grads() where the master addressing puts it.
torch::Tensor ZeroStage::local_grad_sq_norm_of(const std::vector<bool>& counted, int rank) {
  const auto& grads = master_grads();
  auto total = torch::zeros({}, grads.options().dtype(torch::kFloat64));
  for (const auto& fragment : layout().shard_fragments(rank)) {
    if (!counted.at(static_cast<size_t>(fragment.slot))) continue;
    const int64_t at = master_is_whole() ? fragment.flat_offset : master_offset(fragment, rank);
    total += squared_norm_fp64(grads.narrow(0, at, fragment.numel));
  }
  return total;
}

}  // namespace dscpp
