// 1-bit Adam (onebit_optimizer.h gives the schedule). The arithmetic is DeepSpeed's, op for op, so that a step here
// rounds as a step there: update = m / (√v + ε); update += wd·p; p += −lr·update.

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/comm/compressed_allreduce.h"
#include "onebit_common.h"

namespace dscpp::onebit {
namespace {

class OneBitAdam final : public FlatOptimizer {
 public:
  OneBitAdam(const OneBitAdamOptions& o, int64_t numel, const torch::TensorOptions& state_options,
             std::shared_ptr<Comm> comm)
      : beta1_(o.betas[0]),
        beta2_(o.betas[1]),
        eps_(o.eps),
        weight_decay_(o.weight_decay),
        freeze_step_(o.freeze_step),
        comm_(std::move(comm)),
        numel_(numel),
        exp_avg_(torch::zeros({numel}, state_options)),
        exp_avg_sq_(torch::zeros({numel}, state_options)) {
    // DeepSpeed allocates its errors when compression starts and holds them from then on, most of a run; they are
    // allocated here so that a checkpoint has them to fill whatever the phase.
    if (comm_->world_size() > 1) errors_ = CompressionErrors::zeros(numel, comm_->world_size(), state_options);
  }

  void step(torch::Tensor& param, const torch::Tensor& grad, double lr) override {
    if (param.numel() != numel_ || grad.numel() != numel_) {
      throw std::invalid_argument(name() + " step: param and grad must have the partition's " +
                                  std::to_string(numel_) + " elements, got " + std::to_string(param.numel()) +
                                  " and " + std::to_string(grad.numel()));
    }
    begin_step();
    if (steps_ == 1) return;  // DeepSpeed's first step sets up its buffers and updates nothing
    if (compressing(steps_)) {
      torch::NoGradGuard no_grad;
      exp_avg_.mul_(beta1_).add_(grad, 1.0 - beta1_);
      if (comm_->world_size() > 1) compressed_all_reduce(*comm_, exp_avg_, errors_);
    }
    update_at(OptimizerSlice{param, grad, {exp_avg_, exp_avg_sq_}, {}, std::nullopt}, 0, lr);
  }

  void begin_step() override { ++steps_; }

  // One range of the partition (a parameter group's, with its weight decay and lr). step() alone calls it: the
  // compressed momentum is a collective over the whole partition, which no sliced caller (offload) could run.
  void update(const OptimizerSlice& slice, double lr) override {
    torch::NoGradGuard no_grad;
    const bool warm_up = !compressing(steps_);
    const double weight_decay = slice.weight_decay.value_or(weight_decay_);
    for (int64_t offset = 0; offset < slice.param.numel(); offset += kChunk) {
      const int64_t length = std::min(kChunk, slice.param.numel() - offset);
      auto p = slice.param.narrow(0, offset, length);
      auto m = slice.state[0].narrow(0, offset, length);
      auto v = slice.state[1].narrow(0, offset, length);
      if (warm_up) {
        const auto g = slice.grad.narrow(0, offset, length);
        m.mul_(beta1_).add_(g, 1.0 - beta1_);
        v.mul_(beta2_).addcmul_(g, g, 1.0 - beta2_);
      }
      auto update = scratch(update_, length, p);
      adam_direction(update, m, v, p, eps_, weight_decay, decay_);
      p.add_(update.mul_(-lr));
    }
  }

  bool wants_local_gradients() const override { return compressing(steps_ + 1); }

  // A schedule cycling momentum (OneCycle) moves the betas, which DeepSpeed's OnebitAdam reads at every step.
  void set_betas(double beta1, double beta2) override {
    require(beta1 >= 0.0 && beta1 < 1.0, "betas[0]", "(set by the schedule's momentum) must be in [0, 1)", beta1);
    require(beta2 >= 0.0 && beta2 < 1.0, "betas[1]", "(set by the schedule's momentum) must be in [0, 1)", beta2);
    beta1_ = beta1;
    beta2_ = beta2;
  }

  int64_t numel() const override { return numel_; }
  std::vector<std::pair<std::string, torch::Tensor>> state_tensors() override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }
  std::vector<std::pair<std::string, torch::Tensor>> rank_state() override {
    if (!errors_.worker.defined()) return {};
    return {{"worker_error", errors_.worker}, {"server_error", errors_.server}};
  }
  int64_t step_count() const override { return steps_; }
  void set_step_count(int64_t steps) override { steps_ = steps; }
  std::string name() const override { return "OneBitAdam"; }

 private:
  // Step `step` (from 1) compresses: DeepSpeed freezes at the end of the first step >= freeze_step after its set-up
  // step, so the first compressed step is max(freeze_step, 2) + 1.
  bool compressing(int64_t step) const { return step > std::max<int64_t>(freeze_step_, 2); }

  double beta1_, beta2_, eps_, weight_decay_;
  int64_t freeze_step_;
  std::shared_ptr<Comm> comm_;
  int64_t numel_;
  int64_t steps_ = 0;
  torch::Tensor exp_avg_;     // (numel) first moment: averaged over the ranks, exactly or compressed
  torch::Tensor exp_avg_sq_;  // (numel) second moment, frozen once compression starts
  CompressionErrors errors_;  // more than one rank: the compressed all-reduce's error feedback
  torch::Tensor update_, decay_;  // scratch, one chunk each
};

}  // namespace

std::unique_ptr<FlatOptimizer> make_onebit_adam(const OneBitAdamOptions& o, int64_t numel,
                                                const torch::TensorOptions& state_options, std::shared_ptr<Comm> comm) {
  require(o.lr >= 0.0, "lr", "must be >= 0", o.lr);
  require(o.betas[0] >= 0.0 && o.betas[0] < 1.0, "betas[0]", "must be in [0, 1)", o.betas[0]);
  require(o.betas[1] >= 0.0 && o.betas[1] < 1.0, "betas[1]", "must be in [0, 1)", o.betas[1]);
  require(o.eps > 0.0, "eps", "must be > 0", o.eps);
  require(o.weight_decay >= 0.0, "weight_decay", "must be >= 0", o.weight_decay);
  require(o.freeze_step >= 0, "freeze_step", "must be >= 0", static_cast<double>(o.freeze_step));
  return std::make_unique<OneBitAdam>(o, numel, state_options, std::move(comm));
}

}  // namespace dscpp::onebit
