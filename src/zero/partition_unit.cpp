// partition_unit: flatten one unit's parameters in the layout ZeRO-3 gives its group, keep this rank's shard, and
// release the rest.
#include "dscpp/zero/partition_unit.h"

#include <limits>
#include <stdexcept>

#include "dscpp/compat/torch_compat.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/returnable_memory.h"

namespace dscpp {

PrepartitionedUnit partition_unit(std::shared_ptr<torch::nn::Module> unit, Comm& comm,
                                  const torch::TensorOptions& options, int64_t persistence_threshold,
                                  std::unordered_set<const c10::TensorImpl*>& taken) {
  if (!unit) throw std::invalid_argument("partition_unit: the unit is null");
  torch::NoGradGuard no_grad;
  PrepartitionedUnit out;
  out.module = unit;
  std::vector<FlatLayout::Param> described;
  for (const auto& item : unit->named_parameters(/*recurse=*/true)) {
    const auto& p = item.value();
    // The same choice Stage 3 makes at initialize: small parameters persist (stay whole); frozen ones are not
    // ZeRO's to shard.
    if (!p.requires_grad() || p.numel() < persistence_threshold) continue;
    if (!taken.insert(p.unsafeGetTensorImpl()).second) continue;
    out.params.push_back(p);
    described.push_back({item.key(), p.sizes().vec(), false});
  }
  if (out.params.empty()) return out;

  // One group, padded exactly as Stage 3's FlatLayout pads it, so the stage can adopt the shard as it is.
  const FlatLayout layout(described, comm.world_size(), std::numeric_limits<int64_t>::max());
  const auto& group = layout.groups().front();
  out.buffer = returnable_zeros(group.numel, options);
  for (size_t i = 0; i < out.params.size(); ++i) {
    const auto& slot = layout.slots()[i];
    out.buffer.narrow(0, slot.offset, slot.numel).copy_(out.params[i].detach().reshape(-1));
  }
  comm.broadcast(out.buffer, 0).wait();
  out.shard = out.buffer.narrow(0, comm.rank() * group.shard_numel, group.shard_numel).clone();
  for (size_t i = 0; i < out.params.size(); ++i) {
    const auto& slot = layout.slots()[i];
    out.params[i].set_data(out.buffer.narrow(0, slot.offset, slot.numel).view(slot.shape));
  }
  // The parameters' own storage went with set_data; this frees the buffer's, leaving only the shard.
  compat::release_storage(out.buffer);
  // The unit's own tensors were heap chunks, now holes between the shards kept so far. glibc keeps such holes
  // resident, so a model built unit by unit could end up as resident as a whole one: give their pages back.
  trim_heap();
  return out;
}

}  // namespace dscpp
