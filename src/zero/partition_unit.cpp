// partition_unit: flatten one unit's parameters in the layout ZeRO-3 gives its group, keep this rank's shard, and
// release the rest; gather_whole / repartition move such a unit between its two states.
#include "dscpp/zero/partition_unit.h"

#include <limits>
#include <stdexcept>

#include "dscpp/compat/torch_compat.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/returnable_memory.h"

namespace dscpp {
namespace {

// What a partitioned parameter holds until the engine takes it: nothing, in its dtype and on its device.
void make_empty(PrepartitionedUnit& unit) {
  for (auto& p : unit.params) p.set_data(torch::empty({0}, unit.buffer.options()));
}

}  // namespace

PrepartitionedUnit partition_unit(const std::vector<std::pair<std::string, torch::Tensor>>& candidates, Comm& comm,
                                  const torch::TensorOptions& options, PersistenceRule& persistent,
                                  std::unordered_set<const c10::TensorImpl*>& taken) {
  torch::NoGradGuard no_grad;
  PrepartitionedUnit out;
  std::vector<FlatLayout::Param> described;
  for (const auto& [name, p] : candidates) {
    // The same choice Stage 3 makes at initialize: frozen parameters are not ZeRO's to shard; small ones persist
    // (stay whole), each decided once, in order.
    if (!p.defined() || !p.requires_grad()) continue;
    if (!taken.insert(p.unsafeGetTensorImpl()).second) continue;
    if (persistent.admit(p.numel())) continue;
    out.params.push_back(p);
    described.push_back({name, p.sizes().vec(), false});
  }
  if (out.params.empty()) return out;

  // One group, padded exactly as Stage 3's FlatLayout pads it, so the stage can adopt the shard as it is.
  const FlatLayout layout(described, comm.world_size(), std::numeric_limits<int64_t>::max());
  const auto& group = layout.groups().front();
  out.buffer = returnable_zeros(group.numel, options);
  for (size_t i = 0; i < out.params.size(); ++i) {
    const auto& slot = layout.slots()[i];
    out.views.push_back(out.buffer.narrow(0, slot.offset, slot.numel).view(slot.shape));
    out.views.back().copy_(out.params[i].detach());
  }
  comm.broadcast(out.buffer, 0).wait();
  out.shard = out.buffer.narrow(0, comm.rank() * group.shard_numel, group.shard_numel).clone();
  // The parameters' own storage goes with this; release_storage frees the buffer's, leaving only the shard.
  make_empty(out);
  compat::release_storage(out.buffer);
  // The unit's own tensors were heap chunks, now holes between the shards kept so far. glibc keeps such holes
  // resident, so a model built unit by unit could end up as resident as a whole one: give their pages back.
  trim_heap();
  return out;
}

PrepartitionedUnit partition_unit(std::shared_ptr<torch::nn::Module> unit, Comm& comm,
                                  const torch::TensorOptions& options, PersistenceRule& persistent,
                                  std::unordered_set<const c10::TensorImpl*>& taken) {
  if (!unit) throw std::invalid_argument("partition_unit: the unit is null");
  std::vector<std::pair<std::string, torch::Tensor>> candidates;
  for (const auto& item : unit->named_parameters(/*recurse=*/true)) candidates.emplace_back(item.key(), item.value());
  auto out = partition_unit(candidates, comm, options, persistent, taken);
  out.module = std::move(unit);
  return out;
}

void gather_whole(PrepartitionedUnit& unit, Comm& comm) {
  if (unit.whole || unit.params.empty()) return;
  torch::NoGradGuard no_grad;
  allocate_returnable(unit.buffer, unit.buffer.numel() * unit.buffer.element_size());
  comm.all_gather(unit.buffer, unit.shard).wait();
  point_into_buffer(unit);
  unit.whole = true;
}

void repartition(PrepartitionedUnit& unit, Comm& comm, int modifier_rank) {
  if (!unit.whole) return;
  torch::NoGradGuard no_grad;
  if (modifier_rank >= 0) {
    if (modifier_rank >= comm.world_size()) {
      throw std::invalid_argument("modifier_rank " + std::to_string(modifier_rank) + " is not a rank of this job of " +
                                  std::to_string(comm.world_size()));
    }
    comm.broadcast(unit.buffer, modifier_rank).wait();
    unit.shard.copy_(unit.buffer.narrow(0, comm.rank() * unit.shard.numel(), unit.shard.numel()));
  }
  make_empty(unit);
  compat::release_storage(unit.buffer);
  unit.whole = false;
}

void point_into_buffer(PrepartitionedUnit& unit) {
  for (size_t i = 0; i < unit.params.size(); ++i) unit.params[i].set_data(unit.views[i]);
}

}  // namespace dscpp
