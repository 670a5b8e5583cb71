// ShardedMaster: the partitions of the sharded stages and their two collectives.
#include "dscpp/zero/sharded_master.h"

#include "dscpp/comm/quantized_reduce_scatter.h"
#include "dscpp/zero/grad_norm.h"
#include "dscpp/offload/host_memory.h"
#include "dscpp/zero/in_flight.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dscpp {

ShardedMaster::ShardedMaster(const StageContext& context, const FlatLayout& layout, const torch::Tensor& partition)
    : ctx_(context), layout_(layout) {
  if (partition.numel() != layout.partition_numel()) {
    throw std::invalid_argument("ShardedMaster: partition has " + std::to_string(partition.numel()) +
                                " elements, the layout " + std::to_string(layout.partition_numel()));
  }
  if (const auto& offload = ctx_.optimizer_offload; offload.offloaded()) {
    const auto host = host_options(offload.pin_memory);
    const bool usable = partition.device().is_cpu() && partition.scalar_type() == torch::kFloat32;
    const bool in_store = offload.device == OffloadDevice::kNvme;
    master_ = usable || in_store ? partition : torch::empty({partition.numel()}, host).copy_(partition);
    grad_shard_ = torch::zeros({layout.partition_numel()}, host);
    return;
  }
  master_ = partition.scalar_type() == torch::kFloat32 ? partition : partition.to(torch::kFloat32);
  grad_shard_ = torch::zeros({layout.partition_numel()},
                             partition.options().dtype(ctx_.comm_dtype.value_or(partition.scalar_type())));
}

Handle ShardedMaster::reduce_group(int group, const torch::Tensor& group_grads) {
  const auto& g = layout_.groups()[group];
  // The input is a scratch view (the stage's gradient buffer or bucket), so dividing it in place is safe, and so is
  // reduce_scatter false's all-reduce, which leaves the whole bucket's sum in it.
  // The reduction runs in the communication dtype on the gradients' device, whatever dtype and place the shard has.
  const auto wire_dtype = ctx_.comm_dtype.value_or(group_grads.scalar_type());
  auto input = group_grads.scalar_type() == wire_dtype ? group_grads : group_grads.to(wire_dtype);
  if (ctx_.grad_pre_divide != 1.0) input.div_(ctx_.grad_pre_divide);
  torch::Tensor shard;
  Handle pending;
  auto& comm = ctx_.comm_for(g);
  if (ctx_.quantized_gradients) {
    // qgZ (stage 3, where expert groups are refused: `comm` is the data group the hpZ splits came from).
    shard = torch::empty({g.shard_numel}, input.options());
    pending = quantized_reduce_scatter(comm, shard, input, ctx_.hpz_comm.get(), ctx_.hpz_across.get());
  } else if (ctx_.reduce_scatter) {
    shard = torch::empty({g.shard_numel}, input.options());
    pending = comm.reduce_scatter(shard, input, ReduceOp::kSum);
  } else {
    pending = comm.all_reduce(input, ReduceOp::kSum);
    shard = input.narrow(0, static_cast<int64_t>(comm.rank()) * g.shard_numel, g.shard_numel);
  }
  const double post = ctx_.grad_post_scale;
  auto target = grad_shard_.narrow(0, g.partition_offset, g.shard_numel);
  return Handle([pending, shard, input, target, post]() mutable {
    pending.wait();
    // Summed over micro-steps. Offloaded, this is where the bucket's gradient moves to the host.
    target.add_(shard.device() == target.device() ? shard : shard.to(target.device()), post);
  });
}

torch::Tensor& ShardedMaster::prepare_master_grads() {
  master_grads_ = grad_shard_.scalar_type() == torch::kFloat32 ? grad_shard_ : grad_shard_.to(torch::kFloat32);
  return master_grads_;
}

void ShardedMaster::zero_grads() {
  grad_shard_.zero_();
  master_grads_ = torch::Tensor();
}

int64_t ShardedMaster::master_grad_bytes() const {
  return master_grads_.defined() && !master_grads_.is_same(grad_shard_) ? master_grads_.nbytes() : 0;
}

void ShardedMaster::gather_group(InFlight& in_flight, Comm& comm, const torch::Tensor& input, torch::Tensor output) {
  const int64_t world = comm.world_size();
  const int64_t shard = input.numel();
  // As DeepSpeed's bucketed all-gather, pieces of each shard, here sized so that no collective gathers more than
  // allgather_bucket_size elements.
  if (shard * world <= ctx_.allgather_bucket_numel) {
    in_flight.push(comm.all_gather(output, input), {input});
    return;
  }
  // A piece of every rank's shard gathers into a (world, piece) scratch, then into its columns of the output's
  // (world, shard) rank-major layout.
  const auto rows = output.view({world, shard});
  const int64_t piece = std::max<int64_t>(1, ctx_.allgather_bucket_numel / world);
  for (int64_t begin = 0; begin < shard; begin += piece) {
    const int64_t length = std::min(piece, shard - begin);
    auto part = input.narrow(0, begin, length);
    auto gathered = torch::empty({world * length}, output.options());
    Handle pending = comm.all_gather(gathered, part);
    auto columns = rows.narrow(1, begin, length);
    in_flight.push(Handle([pending, gathered, columns, world, length]() mutable {
                     pending.wait();
                     columns.copy_(gathered.view({world, length}));
                   }),
                   {part});
  }
}

void ShardedMaster::publish(FlatParams& flat) {
  InFlight in_flight(kMaxCollectivesInFlight);
  for (const auto& g : layout_.groups()) {
    auto input = master_.narrow(0, g.partition_offset, g.shard_numel).to(flat.dtype());
    gather_group(in_flight, ctx_.comm_for(g), input, flat.params().narrow(0, g.offset, g.numel));
  }
  in_flight.drain();
}

void ShardedMaster::publish_range(FlatParams& flat, int64_t begin, const torch::Tensor& values) {
  if (!publishing_) {
    publish_buffer_ = torch::empty({layout_.partition_numel()}, flat.params().options());
    next_publish_group_ = 0;
    publishing_ = std::make_unique<InFlight>(kMaxCollectivesInFlight);
  }
  publish_buffer_.narrow(0, begin, values.numel()).copy_(values);
  const int64_t done = begin + values.numel();
  const auto& groups = layout_.groups();
  while (next_publish_group_ < groups.size()) {
    const auto& g = groups[next_publish_group_];
    if (g.partition_offset + g.shard_numel > done) break;
    auto input = publish_buffer_.narrow(0, g.partition_offset, g.shard_numel);
    gather_group(*publishing_, ctx_.comm_for(g), input, flat.params().narrow(0, g.offset, g.numel));
    ++next_publish_group_;
  }
}

void ShardedMaster::finish_publish() {
  if (!publishing_) return;
  if (next_publish_group_ != layout_.groups().size()) {
    throw std::logic_error("ShardedMaster::finish_publish: the pieces covered " + std::to_string(next_publish_group_) +
                           " of " + std::to_string(layout_.groups().size()) + " groups");
  }
  publishing_->drain();
  publishing_.reset();
  publish_buffer_ = torch::Tensor();
}

torch::Tensor ShardedMaster::local_grad_sq_norm() const {
  return squared_norm_fp64(master_grads_);
}

}  // namespace dscpp
