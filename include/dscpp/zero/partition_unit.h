// partition_unit: one step of partitioned construction (DeepSpeed's zero.Init) — a gather unit that has just been
// built and initialised is cut down to this rank's ZeRO-3 shard before the next unit exists.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <unordered_set>
#include <vector>

#include "dscpp/comm/comm.h"

namespace dscpp {

// A unit built already partitioned. Its parameters stay registered in the module, as views of `buffer`, whose
// memory is released (exactly as ZeRO-3 leaves a unit between uses); `shard` holds this rank's values.
struct PrepartitionedUnit {
  std::shared_ptr<torch::nn::Module> module;
  int unit = -1;  // which of the engine's gather units it is (set by the engine when it takes the unit)
  // The trainable parameters of at least the persistence threshold's size that no earlier unit took, in the
  // module's parameter order: the group ZeRO-3 forms for this unit. Smaller ones stay whole (they persist).
  std::vector<torch::Tensor> params;
  torch::Tensor buffer;  // their flat buffer, padded to a multiple of the world size; undefined when params is empty
  torch::Tensor shard;   // elements [rank·s, (rank+1)·s) of the buffer's values, s = buffer numel / world size
};

// Every rank calls it for the same units in the same order: each unit's values are rank 0's (one broadcast), as
// when a whole model is partitioned at initialize. `options` give the dtype and device of the buffer and shard
// (the compute dtype). `taken` holds the parameters earlier units took (a parameter two units share belongs to
// the first) and is updated.
PrepartitionedUnit partition_unit(std::shared_ptr<torch::nn::Module> unit, Comm& comm,
                                  const torch::TensorOptions& options, int64_t persistence_threshold,
                                  std::unordered_set<const c10::TensorImpl*>& taken);

}  // namespace dscpp
