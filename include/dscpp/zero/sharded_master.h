// ShardedMaster: this rank's partitions for the sharded stages (1, 2, 3) — the fp32 master weights, the gradient
// shard accumulated over micro-steps (in the communication dtype, as DeepSpeed keeps it: 2Ψ/N bytes for 16-bit
// training), and the fp32 copy of that shard the optimizer reads, alive only from the boundary to zero_grads().
// Also the collectives that connect them to the whole-model buffers: reduce-scatter of a group's gradients into the
// shard, and (stages 1, 2) all-gather of the updated master back into every rank's compute-dtype parameters.
// With offload_optimizer the master and the gradient shard (then fp32, as DeepSpeed keeps it for the CPU
// optimizer) are in host memory, and each group's reduced gradient is copied there as its reduction completes.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "dscpp/zero/in_flight.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

class ShardedMaster {
 public:
  // `partition` is this rank's shard of every group of `layout`, in group order (partition_numel elements, compute
  // dtype). It becomes the master when it is fp32 (no second copy); otherwise the master is its fp32 copy.
  ShardedMaster(const StageContext& context, const FlatLayout& layout, const torch::Tensor& partition);

  // (partition_numel) fp32; with StageContext::master_in_store, the compute-dtype partition until release_master.
  torch::Tensor& params() { return master_; }

  // Starts reducing group `group`'s gradients (`group_grads`: the group's g.numel elements, compute dtype) over all
  // ranks. The returned Handle's wait() adds this rank's rank-averaged share into the gradient shard.
  Handle reduce_group(int group, const torch::Tensor& group_grads);

  // At the boundary: the fp32 gradient partition for the optimizer (the shard itself when it is fp32).
  torch::Tensor& prepare_master_grads();
  torch::Tensor& master_grads() { return master_grads_; }

  // Zeroes the shard and releases the fp32 copy.
  void zero_grads();

  // All-gathers every group's updated master shard into the compute-dtype parameters on every rank.
  void publish(FlatParams& flat);
  // The same from pieces of the updated partition handed over in order (ZeroStage::publish_range): each group's
  // all-gather starts as soon as its shard is complete. finish_publish waits for all of them.
  void publish_range(FlatParams& flat, int64_t begin, const torch::Tensor& values);
  void finish_publish();

  torch::Tensor local_grad_sq_norm() const;
  // Bytes of the fp32 master (stage 3 in fp32 shares them with its parameter shard and counts them there).
  int64_t master_bytes() const { return master_.defined() ? master_.nbytes() : 0; }
  // The master moved to an offload store (ZeroStage::release_master).
  void release_master() { master_ = torch::Tensor(); }
  int64_t shard_bytes() const { return grad_shard_.nbytes(); }
  // The fp32 gradient partition while it exists (boundary to zero_grads), 0 when it is the shard itself.
  int64_t master_grad_bytes() const;

 private:
  // All-gathers one group's shards (`input`: this rank's) over `comm` (StageContext::comm_for the group) into
  // `output` (the group's g.numel elements), in pieces of at most allgather_bucket_size elements gathered.
  void gather_group(InFlight& in_flight, Comm& comm, const torch::Tensor& input, torch::Tensor output);

  StageContext ctx_;
  const FlatLayout& layout_;
  torch::Tensor master_;        // (partition_numel) fp32: rank r's shard of every group, in group order
  torch::Tensor grad_shard_;    // (partition_numel) communication dtype: reduced gradients, summed over micro-steps
  torch::Tensor master_grads_;  // (partition_numel) fp32: grad_shard_ widened for the optimizer
  // While a piecewise publish runs: the updated partition in the compute dtype on the parameters' device, the next
  // group to gather, and the gathers running.
  torch::Tensor publish_buffer_;
  size_t next_publish_group_ = 0;
  std::unique_ptr<InFlight> publishing_;
};

}  // namespace dscpp
