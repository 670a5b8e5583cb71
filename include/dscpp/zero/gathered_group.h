// GatheredGroup: the parameter record of one ZeRO-3 group (a block's parameters, or the persistent small ones).
// This rank keeps only its shard (a slice of the stage's 16-bit partition). While the group is in use its whole
// flat buffer exists and the module's parameters are views into it; released, the buffer's memory is given back
// (returnable_memory.h, compat::release_storage) and the parameters read as 0-element tensors, as DeepSpeed leaves
// them, so a read between forwards (a state_dict, a print) finds an empty tensor instead of freed memory.
// With offload_param the shard is in host memory (copied to the buffer's device for the gather) or on NVMe (read for
// each gather).
//
// States: kSharded → (start_gather) → kGathering → (wait_gathered) → kGathered → (release) → kSharded. Every
// transition is idempotent: gathering a gathered group or releasing a sharded one does nothing.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/block_quantizer.h"
#include "dscpp/comm/comm.h"
#include "dscpp/offload/state_store.h"

namespace dscpp {

// How a group's gathers move the shards: as they are, or (ZeRO++ qwZ, zero_quantized_weights) as int8 blocks that
// every rank dequantizes on arrival (comm/quantized_all_gather.h). The shards themselves, and the master, stay exact.
enum class GatherWire { kExact, kInt8 };

class GatheredGroup {
 public:
  enum class State { kSharded, kGathering, kGathered };

  // `buffer`: the group's flat buffer (numel = shard.numel() × world size), holding the parameters as views;
  // `shard`: this rank's slice of it, stored in the stage's partition. `initial`: kGathered when the buffer holds
  // the values, kSharded when its memory is already released (a unit built partitioned).
  GatheredGroup(std::string name, torch::Tensor buffer, torch::Tensor shard, State initial = State::kGathered,
                GatherWire wire = GatherWire::kExact);

  const std::string& name() const { return name_; }
  State state() const { return state_; }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * element_size_; }
  // Bytes this group's buffer holds right now: bytes() unless sharded.
  int64_t live_bytes() const { return state_ == State::kSharded ? 0 : bytes(); }

  // kSharded → kGathering: allocates the buffer and starts the all-gather of every rank's shard into it.
  void start_gather(Comm& comm);
  // → kGathered, gathering first if sharded.
  void wait_gathered(Comm& comm);
  // → kSharded: waits for a gather still in flight (every rank issued it), then frees the buffer's memory.
  void release();

  // The parameters that are views of the buffer, and those views (`views[i]` is `params[i]`'s, of its shape).
  // Gathered, each parameter is its view; sharded, a 0-element tensor. Autograd saves these same parameter tensors
  // and reads them only in their unit's backward, for which the stage gathers the group again (re-pointing them).
  void hold(std::vector<torch::Tensor> params, std::vector<torch::Tensor> views);
  // offload_param nvme: the shard lives in `store` (its sub-group `index`), read from there for each gather; this
  // object's own shard is dropped.
  void keep_shard_in(StateStore* store, int index);

  const torch::Tensor& buffer() const { return buffer_; }

  // ZeRO++ zero_quantized_nontrainable_weights (a frozen group): the shard is kept as int8 blocks with an fp32 scale
  // each (block_quantizer.h), about a quarter of fp32's bytes, sent as they are and dequantized on arrival. Its
  // values from then on are the blocks'.
  void store_quantized();
  // The shard in memory of its own (not a view of a partition that can then be freed).
  void own_shard() { shard_ = shard_.clone(); }
  // Elements [offset, offset + n) of this rank's shard: read into `out` (n = out.numel()), or set to `values`.
  // Quantized, a write re-quantizes the shard; kept in a store, the store's sub-group is read or written.
  void read_shard(int64_t offset, torch::Tensor out) const;
  void write_shard(int64_t offset, const torch::Tensor& values);
  // Bytes this rank's shard takes in memory (int8 blocks and scales when quantized; 0 when kept in a store).
  int64_t shard_bytes() const;

  // ZeRO++ hpZ: after the first gather since the values last changed, this rank keeps a secondary shard, its part of
  // the buffer over `comm` (the hpZ group: zero_hpz_partition_size consecutive ranks, typically one node), and every
  // later gather assembles the buffer from those parts inside the group, exact, instead of over every rank. The
  // values are those of the first gather (dequantized, under qwZ), so every gather of a step gives the same weights.
  void keep_secondary_over(std::shared_ptr<Comm> comm);
  // The shards changed (the optimizer stepped): the next gather goes over every rank again and refreshes it.
  void drop_secondary() { secondary_valid_ = false; }
  int64_t secondary_bytes() const { return secondary_.defined() ? secondary_.nbytes() : 0; }

 private:
  void point_params();  // each held parameter at its view (gathered) or at the empty tensor (otherwise)

  std::string name_;
  torch::Tensor buffer_;
  torch::Tensor shard_;
  QuantizedBlocks stored_;  // store_quantized: the shard, instead of shard_ (values undefined otherwise)
  int64_t numel_;
  int64_t shard_numel_;
  int64_t element_size_;
  State state_ = State::kGathered;
  GatherWire wire_ = GatherWire::kExact;
  Handle gather_;
  torch::Tensor gather_input_;  // what the running gather reads: the shard, or its copy on the buffer's device
  StateStore* store_ = nullptr;
  int store_index_ = -1;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> views_;
  torch::Tensor empty_;  // what a held parameter is while the group is not gathered
  std::shared_ptr<Comm> secondary_comm_;  // hpZ: null when off
  torch::Tensor secondary_;               // hpZ: this rank's part of the buffer over secondary_comm_
  bool secondary_valid_ = false;          // it holds the current values
};

}  // namespace dscpp
