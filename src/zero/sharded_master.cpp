// ShardedMaster: the partitions of the sharded stages and their two collectives.
#include "dscpp/zero/sharded_master.h"

#include "dscpp/zero/grad_norm.h"
#include "dscpp/zero/in_flight.h"

#include <stdexcept>
#include <string>

namespace dscpp {

ShardedMaster::ShardedMaster(const StageContext& context, const FlatLayout& layout, const torch::Tensor& partition)
    : ctx_(context), layout_(layout) {
  if (partition.numel() != layout.partition_numel()) {
    throw std::invalid_argument("ShardedMaster: partition has " + std::to_string(partition.numel()) +
                                " elements, the layout " + std::to_string(layout.partition_numel()));
  }
  master_ = partition.scalar_type() == torch::kFloat32 ? partition : partition.to(torch::kFloat32);
  grad_shard_ = torch::zeros({layout.partition_numel()},
                             partition.options().dtype(ctx_.comm_dtype.value_or(partition.scalar_type())));
}

Handle ShardedMaster::reduce_group(int group, const torch::Tensor& group_grads) {
  const auto& g = layout_.groups()[group];
  // The input is a scratch view (the stage's gradient buffer or bucket), so dividing it in place is safe.
  auto input = group_grads.scalar_type() == grad_shard_.scalar_type() ? group_grads
                                                                       : group_grads.to(grad_shard_.scalar_type());
  if (ctx_.grad_pre_divide != 1.0) input.div_(ctx_.grad_pre_divide);
  auto shard = torch::empty({g.shard_numel}, input.options());
  Handle pending = ctx_.comm->reduce_scatter(shard, input, ReduceOp::kSum);
  const double post = ctx_.grad_post_scale;
  auto target = grad_shard_.narrow(0, g.partition_offset, g.shard_numel);
  return Handle([pending, shard, input, target, post]() mutable {
    pending.wait();
    target.add_(shard, post);  // summed over micro-steps
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

void ShardedMaster::publish(FlatParams& flat) {
  InFlight in_flight(kMaxCollectivesInFlight);
  for (const auto& g : layout_.groups()) {
    auto input = master_.narrow(0, g.partition_offset, g.shard_numel).to(flat.dtype());
    auto output = flat.params().narrow(0, g.offset, g.numel);
    in_flight.push(ctx_.comm->all_gather(output, input), {input});
  }
  in_flight.drain();
}

torch::Tensor ShardedMaster::local_grad_sq_norm() const {
  return squared_norm_fp64(master_grads_);
}

}  // namespace dscpp
