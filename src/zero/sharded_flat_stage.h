// Stages 1 and 2's common half: whole 16-bit parameters in one flat buffer on every rank (FlatParams), the fp32
// master and optimizer state sharded (ShardedMaster). What differs between them is only how the gradients reach the
// shard: stage 1 reduces its whole-model buffer at the boundary, stage 2 bucket by bucket during backward.
#pragma once

#include "dscpp/zero/flat_params.h"
#include "dscpp/zero/sharded_master.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

class ShardedFlatStage : public ZeroStage {
 public:
  explicit ShardedFlatStage(const StageContext& context)
      : flat_(*context.flat), master_(context, flat_.layout(), flat_.partition(context.comm->rank())) {}

  const FlatLayout& layout() const final { return flat_.layout(); }
  torch::Tensor& master_params() final { return master_.params(); }
  void release_master() final { master_.release_master(); }
  torch::Tensor& master_grads() final { return master_.master_grads(); }
  torch::Tensor local_grad_sq_norm() final { return master_.local_grad_sq_norm(); }
  void publish_params() final { master_.publish(flat_); }
  void publish_range(int64_t begin, const torch::Tensor& values) final { master_.publish_range(flat_, begin, values); }
  void finish_publish() final { master_.finish_publish(); }
  void visit_params(const ParamVisitor& fn) final { flat_.visit(fn); }

 protected:
  FlatParams& flat_;
  ShardedMaster master_;
};

}  // namespace dscpp
