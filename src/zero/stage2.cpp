// Stage 2: gradients sharded too. No whole-model gradient buffer: a hook on each parameter's gradient accumulator
// copies the fresh gradient into its group's bucket and frees it; complete buckets are reduce-scattered
// asynchronously while backward goes on (overlap_comm), and each rank keeps only its shard.
#include <map>

#include "dscpp/compat/torch_compat.h"
#include "dscpp/zero/in_flight.h"
#include "sharded_flat_stage.h"

namespace dscpp {
namespace {

class Stage2 final : public ShardedFlatStage {
 public:
  explicit Stage2(const StageContext& context)
      : ShardedFlatStage(context), in_flight_(context.overlap_comm ? kMaxCollectivesInFlight : 0) {
    const auto& params = flat_.param_tensors();
    remaining_.resize(flat_.layout().groups().size());
    reset_micro_step();
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mutable_grad() = torch::Tensor();  // a gradient from before initialize must not leak into step 1
      hooks_.push_back(std::make_unique<compat::PostAccumulateGradHook>(params[i], [this, i] { on_grad_ready(i); }));
    }
  }

  int stage() const override { return 2; }

  void before_backward() override { in_backward_ = true; }

  // Reduces what backward left (parameters that got no gradient count as zeros), then waits for everything this
  // micro-step started.
  void after_backward() override {
    in_backward_ = false;
    launch_ready(/*all=*/true);
    in_flight_.drain();
    reset_micro_step();
  }

  // Reduced bucket by bucket in backward; only the fp32 widening for the optimizer is left.
  void reduce_gradients() override { master_.prepare_master_grads(); }

  void zero_grads() override { master_.zero_grads(); }

  StageMemory memory() const override {
    StageMemory m;
    m.params16 = flat_.params().nbytes();
    m.grads16 = master_.shard_bytes();  // the only gradients kept between micro-steps
    m.master = master_.master_bytes();
    int64_t bucket_numel = 0;
    for (const auto& g : flat_.layout().groups()) bucket_numel = std::max(bucket_numel, g.numel);
    // Buckets being filled or reduced, and the boundary's fp32 gradient.
    m.buffers = master_.master_grad_bytes() + bucket_numel * flat_.params().element_size() * (in_flight_.limit() + 2);
    return m;
  }

 private:
  void reset_micro_step() {
    const auto& groups = flat_.layout().groups();
    for (size_t g = 0; g < groups.size(); ++g) remaining_[g] = groups[g].param_end - groups[g].param_begin;
    next_launch_ = static_cast<int>(groups.size()) - 1;
    filling_.clear();
  }

  torch::Tensor& bucket(int group) {
    auto it = filling_.find(group);
    if (it == filling_.end()) {
      it = filling_.emplace(group, torch::zeros({flat_.layout().groups()[group].numel}, flat_.params().options())).first;
    }
    return it->second;
  }

  void on_grad_ready(size_t i) {
    if (!in_backward_) {
      throw std::logic_error("ZeRO stage 2 received a gradient outside Engine::backward: call engine->backward(loss) "
                             "instead of loss.backward(), so the loss is scaled and the gradient reduced");
    }
    auto& param = flat_.param_tensors()[i];
    const auto& slot = flat_.layout().slots()[i];
    const auto& group = flat_.layout().groups()[slot.group];
    bucket(slot.group).narrow(0, slot.offset - group.offset, slot.numel).copy_(param.grad().reshape(-1));
    param.mutable_grad() = torch::Tensor();  // free it: only the shard is kept
    --remaining_[slot.group];
    launch_ready(/*all=*/false);
  }

  // Buckets are reduced in descending group order — the order backward usually completes them — and a bucket waits
  // for every later one, so every rank issues the same collectives in the same order even if gradients arrive
  // differently (a parameter that got no gradient on one rank only).
  void launch_ready(bool all) {
    while (next_launch_ >= 0 && (all || remaining_[next_launch_] == 0)) {
      auto buffer = std::move(bucket(next_launch_));
      filling_.erase(next_launch_);
      in_flight_.push(master_.reduce_group(next_launch_, buffer), {buffer});
      --next_launch_;
    }
  }

  InFlight in_flight_;
  std::vector<std::unique_ptr<compat::PostAccumulateGradHook>> hooks_;
  bool in_backward_ = false;
  std::vector<int> remaining_;            // per group: parameters still without a gradient this micro-step
  int next_launch_ = -1;                  // the highest group not reduced yet this micro-step
  std::map<int, torch::Tensor> filling_;  // buckets being filled, by group
};

}  // namespace

std::unique_ptr<ZeroStage> make_stage2(const StageContext& context) { return std::make_unique<Stage2>(context); }

}  // namespace dscpp
