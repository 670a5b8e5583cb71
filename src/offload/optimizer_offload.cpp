// OptimizerOffload: the host step, sub-group by sub-group, each published as soon as it is updated.
#include "dscpp/offload/optimizer_offload.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace dscpp {

OptimizerOffload::OptimizerOffload(FlatOptimizer& optimizer, std::unique_ptr<StateStore> store, ZeroStage& stage,
                                   torch::ScalarType compute_dtype)
    : optimizer_(optimizer), store_(std::move(store)), stage_(stage) {
  if (compute_dtype != torch::kFloat32) {
    staging16_ = torch::empty({store_->largest_sub_group()}, torch::TensorOptions().dtype(compute_dtype));
  }
}

void OptimizerOffload::step(const torch::Tensor& grads, double lr) {
  if (grads.numel() != store_->numel() || !grads.device().is_cpu()) {
    throw std::invalid_argument("OptimizerOffload::step: the gradient partition must be " +
                                std::to_string(store_->numel()) + " elements on the host, got " +
                                std::to_string(grads.numel()) + " on " + grads.device().str());
  }
  optimizer_.begin_step();
  for (int i = 0; i < store_->sub_groups(); ++i) {
    const int64_t begin = store_->sub_group_begin(i);
    const int64_t n = store_->sub_group_numel(i);
    auto tensors = store_->acquire(i);
    OptimizerSlice slice{tensors[0], grads.narrow(0, begin, n), {tensors.begin() + 1, tensors.end()}, {}, std::nullopt};
    if (staging16_.defined()) slice.param16 = staging16_.narrow(0, 0, n);
    optimizer_.update_at(slice, begin, lr);
    // The stage copies the values before returning, so the staging buffer is free for the next sub-group.
    stage_.publish_range(begin, staging16_.defined() ? slice.param16 : slice.param);
    store_->release(i);
  }
  stage_.finish_publish();
  store_->flush();
}

void OptimizerOffload::publish() {
  for (int i = 0; i < store_->sub_groups(); ++i) {
    const int64_t n = store_->sub_group_numel(i);
    auto master = store_->acquire(i).front();
    stage_.publish_range(store_->sub_group_begin(i),
                         staging16_.defined() ? staging16_.narrow(0, 0, n).copy_(master) : master);
    store_->release(i, /*modified=*/false);
  }
  stage_.finish_publish();
}

}  // namespace dscpp
