// Stage 2: gradients sharded too. No whole-model gradient buffer: a hook on each parameter's gradient
// accumulator copies the fresh gradient into its group's bucket and frees it; when a bucket is complete it is
// reduce-scattered asynchronously while backward goes on (overlap_comm), and each rank keeps only its fp32 shard.
#include <deque>
#include <map>

#include "dscpp/compat/torch_compat.h"
#include "dscpp/zero/sharded_master.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {
namespace {

// Buckets reducing at once with overlap_comm. Waiting for the oldest before starting a third keeps bucket memory
// bounded (DeepSpeed double-buffers the same way); by then the oldest has usually finished while compute ran.
constexpr size_t kMaxBucketsInFlight = 2;

class Stage2 final : public ZeroStage {
 public:
  explicit Stage2(const StageContext& context)
      : ctx_(context), flat_(*context.flat), master_(context), max_in_flight_(context.overlap_comm ? kMaxBucketsInFlight : 0) {
    const auto& layout = flat_.layout();
    remaining_.resize(layout.groups().size());
    reset_counts();
    const auto& params = flat_.param_tensors();
    for (size_t i = 0; i < params.size(); ++i) {
      hooks_.push_back(compat::add_post_accumulate_grad_hook(params[i], [this, i] { on_grad_ready(i); }));
    }
  }

  int stage() const override { return 2; }

  void before_backward() override {}

  // Reduces the buckets backward did not complete (parameters that got no gradient count as zeros) in group order,
  // identical on every rank, then waits for everything this micro-step started.
  void after_backward() override {
    for (size_t g = 0; g < remaining_.size(); ++g) {
      if (!launched_[g]) launch(static_cast<int>(g));
    }
    drain(0);
    reset_counts();
  }

  // Reduced bucket by bucket in backward; only the fp32 widening for the optimizer is left.
  void reduce_gradients() override { master_.prepare_master_grads(); }

  torch::Tensor& master_params() override { return master_.params(); }
  torch::Tensor& master_grads() override { return master_.master_grads(); }
  torch::Tensor local_grad_sq_norm() override { return master_.local_grad_sq_norm(); }
  void publish_params() override { master_.publish(); }
  void zero_grads() override { master_.zero_grads(); }

  StageMemory memory() const override {
    StageMemory m;
    m.params16 = flat_.params().nbytes();
    m.grads16 = master_.shard_bytes();  // the only gradients kept between micro-steps
    m.master = master_.master_bytes();
    int64_t bucket_numel = 0;  // at most (max_in_flight_ + 1) buckets are alive at once
    for (const auto& g : flat_.layout().groups()) bucket_numel = std::max(bucket_numel, g.numel);
    m.buffers = master_.master_grad_bytes() + bucket_numel * flat_.params().element_size() * (max_in_flight_ + 1);
    return m;
  }

 private:
  struct InFlight {
    Handle handle;
    torch::Tensor bucket;  // kept alive until the reduction finished
  };

  void reset_counts() {
    const auto& groups = flat_.layout().groups();
    for (size_t g = 0; g < groups.size(); ++g) remaining_[g] = groups[g].param_end - groups[g].param_begin;
    launched_.assign(groups.size(), false);
  }

  torch::Tensor& bucket(int group) {
    auto it = filling_.find(group);
    if (it == filling_.end()) {
      it = filling_.emplace(group, torch::zeros({flat_.layout().groups()[group].numel}, flat_.params().options())).first;
    }
    return it->second;
  }

  void on_grad_ready(size_t i) {
    auto& param = flat_.param_tensors()[i];
    const auto& slot = flat_.layout().slots()[i];
    const auto& group = flat_.layout().groups()[slot.group];
    bucket(slot.group).narrow(0, slot.offset - group.offset, slot.numel).copy_(param.grad().reshape(-1));
    param.mutable_grad() = torch::Tensor();  // free it: only the shard is kept
    if (--remaining_[slot.group] == 0) launch(slot.group);
  }

  void launch(int group) {
    auto buffer = std::move(bucket(group));
    filling_.erase(group);
    launched_[group] = true;
    in_flight_.push_back({master_.reduce_group(group, buffer), buffer});
    drain(max_in_flight_);
  }

  // Waits for the oldest reductions until at most `keep` are still running.
  void drain(size_t keep) {
    while (in_flight_.size() > keep) {
      in_flight_.front().handle.wait();
      in_flight_.pop_front();
    }
  }

  StageContext ctx_;
  FlatParams& flat_;
  ShardedMaster master_;
  size_t max_in_flight_;
  std::vector<std::shared_ptr<torch::autograd::Node>> hooks_;  // keeps the hooked accumulators alive
  std::vector<int> remaining_;                                 // per group: parameters still without a gradient
  std::vector<bool> launched_;                                 // per group: reduced this micro-step
  std::map<int, torch::Tensor> filling_;                       // buckets being filled, by group
  std::deque<InFlight> in_flight_;
};

}  // namespace

std::unique_ptr<ZeroStage> make_stage2(const StageContext& context) { return std::make_unique<Stage2>(context); }

}  // namespace dscpp
