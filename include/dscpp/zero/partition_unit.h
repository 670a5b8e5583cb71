// partition_unit: one step of partitioned construction (DeepSpeed's zero.Init) — a gather unit that has just been
// built and initialised is cut down to this rank's ZeRO-3 shard before the next unit exists.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "dscpp/comm/comm.h"
#include "dscpp/zero/persistence.h"

namespace dscpp {

// A unit built already partitioned. Its parameters stay registered in their module but hold no memory: until the
// engine takes the unit each is a 0-element tensor of its dtype (as DeepSpeed's are), so code that reads one by
// mistake — printing it, a model.half() — sees an empty tensor instead of freed memory. `shard` holds this rank's
// values; gather_whole makes the parameters whole for a while (DeepSpeed's GatheredParameters, an init function
// reading its module's weights).
struct PrepartitionedUnit {
  std::shared_ptr<torch::nn::Module> module;  // the LibTorch module it was cut from; null from the Python front end
  // The trainable parameters of at least the persistence threshold's size that no earlier unit took, in the
  // module's parameter order: the group ZeRO-3 forms for this unit. Smaller ones stay whole (they persist).
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> views;  // per parameter: its place in `buffer`, shaped as the parameter
  torch::Tensor buffer;  // their flat buffer, padded to a multiple of the world size; its memory exists while whole
  torch::Tensor shard;   // elements [rank·s, (rank+1)·s) of the buffer's values, s = buffer numel / world size
  bool whole = false;    // gathered: the parameters are views of `buffer`, which holds every rank's values
};

// Every rank calls it for the same units in the same order: each unit's values are rank 0's (one broadcast), as
// when a whole model is partitioned at initialize. `options` give the dtype and device of the buffer and shard
// (the compute dtype). `taken` holds the parameters earlier units decided on (a parameter two units share belongs to
// the first) and is updated. `candidates` are the unit's parameters, named; the frozen and those `persistent` admits
// (zero/persistence.h: the rule Stage 3 applies at initialize, carried from unit to unit) are left whole. Returns a
// unit with no parameters when none qualified.
PrepartitionedUnit partition_unit(const std::vector<std::pair<std::string, torch::Tensor>>& candidates, Comm& comm,
                                  const torch::TensorOptions& options, PersistenceRule& persistent,
                                  std::unordered_set<const c10::TensorImpl*>& taken);
// A LibTorch module's parameters (recursively) as one unit.
PrepartitionedUnit partition_unit(std::shared_ptr<torch::nn::Module> unit, Comm& comm,
                                  const torch::TensorOptions& options, PersistenceRule& persistent,
                                  std::unordered_set<const c10::TensorImpl*>& taken);

// Collective (every rank, same units, same order). Makes the parameters whole: every rank's shard is gathered into
// the buffer and the parameters view it. Does nothing when whole already.
void gather_whole(PrepartitionedUnit& unit, Comm& comm);
// Collective. Back to partitioned: with `modifier_rank` >= 0 that rank's values (changed while whole) are broadcast
// first and become every rank's shard; with -1 the values are taken as unchanged. Does nothing when not whole.
void repartition(PrepartitionedUnit& unit, Comm& comm, int modifier_rank);
// For the engine taking a partitioned unit: its parameters become views of the buffer, whose memory stays
// released (ZeRO-3's state of a unit between uses), so the stage sees their shapes and gathers into them in place.
void point_into_buffer(PrepartitionedUnit& unit);

}  // namespace dscpp
