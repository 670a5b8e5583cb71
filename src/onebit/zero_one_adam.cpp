// 0/1 Adam (onebit_optimizer.h gives the schedule). DeepSpeed's zoadam.py, op for op, over the whole partition (its
// parameter groups' weight decay applies per range, update_at; the step's lr is the one lr every range moves by),
// with one change: at a synchronisation DeepSpeed undoes this rank's moves since the last one by subtracting their
// sum, and so each rank's weights come out of it differing in the last bits; here every rank keeps the weights of the
// last synchronisation (the anchor, in the buffer DeepSpeed keeps the sum in) and sets p = anchor + the averaged
// move, so all ranks hold the same weights after each one — the same up to rounding, and a checkpoint taken there
// resumes exactly.
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "compressed_adam.h"
#include "onebit_common.h"

namespace dscpp::onebit {
namespace {

class ZeroOneAdam final : public CompressedAdam {
 public:
  ZeroOneAdam(const ZeroOneAdamOptions& o, int64_t numel, const torch::TensorOptions& state_options,
              std::shared_ptr<Comm> comm)
      : CompressedAdam("ZeroOneAdam", o.betas, o.eps, o.weight_decay, numel, state_options, std::move(comm)),
        o_(o),
        anchor_(torch::zeros({numel}, state_options)) {}

  void step(torch::Tensor& param, const torch::Tensor& grad, double lr) override {
    check_step(param, grad);
    for (const auto& group : groups()) {
      if (group.lr) {  // initialize refuses these; a group lr set since (set_group_lr) is refused here
        throw std::invalid_argument(name() + ": a parameter group with an lr of its own is not supported yet (its "
                                    "synchronisation divides by the sum of the lrs since the last one, which must "
                                    "be the same for every parameter)");
      }
    }
    torch::NoGradGuard no_grad;
    begin_step();
    if (steps_ == 1) return;  // DeepSpeed's set-up step: its buffers are made and nothing moves
    const OptimizerSlice whole{param, grad, {exp_avg_, exp_avg_sq_}, {}, std::nullopt};
    if (!frozen_) {
      const bool variance_step = steps_ % var_interval_ == 0;  // the engine averaged this step's gradients
      if (variance_step) {
        exp_avg_sq_.mul_(beta2_).addcmul_(grad, grad, 1.0 - beta2_);
        exp_avg_.mul_(beta1_).add_(grad, 1.0 - beta1_);
      } else if (!one_rank()) {
        // The gradients averaged compressed, in the anchor (unused until the variance freezes) as scratch. On one
        // rank DeepSpeed leaves m as it is on these steps (its update sits under `if self.size > 1`), and so do we.
        anchor_.copy_(grad);
        compress(anchor_);
        exp_avg_.mul_(beta1_).add_(anchor_, 1.0 - beta1_);
      }
      update_at(whole, 0, lr);
      if (variance_step && ++var_counter_ == o_.var_update_scaler) {
        var_counter_ = 0;
        var_interval_ *= 2;
      }
    } else {
      if (!anchored_) anchor_.copy_(param);  // resumed: the checkpoint was written at a synchronisation
      anchored_ = true;
      exp_avg_.mul_(beta1_).add_(grad, 1.0 - beta1_);
      lrs_ += lr;
      update_at(whole, 0, lr);
      if (steps_ % local_step_interval_ == 0) synchronise(param);
      if (++local_step_counter_ == o_.local_step_scaler) {
        local_step_counter_ = 0;
        local_step_interval_ = std::min(o_.local_step_clipper, local_step_interval_ * 2);
      }
    }
    if (!frozen_ && steps_ > o_.var_freeze_step) {
      frozen_ = true;
      anchor_.copy_(param);  // every rank's weights, the same before the local steps begin
      anchored_ = true;
      reset_errors();
    }
  }

  bool wants_local_gradients() const override { return frozen_ || (steps_ + 1) % var_interval_ != 0; }

  // The counters are a function of the step count: replayed, as a run that took those steps has them. The anchor is
  // the weights at the first step after it (a checkpoint at a synchronisation holds them).
  void set_step_count(int64_t steps) override {
    var_interval_ = 1, var_counter_ = 0, local_step_interval_ = 1, local_step_counter_ = 0;
    frozen_ = false;
    lrs_ = 0;
    anchored_ = false;
    for (int64_t s = 2; s <= steps; ++s) {
      if (!frozen_) {
        if (s % var_interval_ == 0 && ++var_counter_ == o_.var_update_scaler) var_counter_ = 0, var_interval_ *= 2;
      } else if (++local_step_counter_ == o_.local_step_scaler) {
        local_step_counter_ = 0;
        local_step_interval_ = std::min(o_.local_step_clipper, local_step_interval_ * 2);
      }
      if (s > o_.var_freeze_step) frozen_ = true;
    }
    steps_ = steps;
  }

 private:
  // This rank's moves since the last synchronisation averaged over the ranks, as DeepSpeed does: scaled back to m's
  // units (× (√v + ε)), averaged compressed; m is their negated mean per lr, and p the anchor moved by them.
  void synchronise(torch::Tensor& param) {
    auto denominator = exp_avg_sq_.sqrt().add_(eps_);
    auto moved = param - anchor_;
    moved.mul_(denominator);
    compress(moved);
    exp_avg_.zero_().add_(moved / lrs_, -1.0);
    torch::add_out(param, anchor_, moved / denominator);
    anchor_.copy_(param);
    lrs_ = 0;
  }

  const ZeroOneAdamOptions o_;
  // DeepSpeed's per-step state, the same for every parameter.
  int64_t var_interval_ = 1, var_counter_ = 0, local_step_interval_ = 1, local_step_counter_ = 0;
  bool frozen_ = false;  // the variance is frozen (DeepSpeed's freeze_key)
  double lrs_ = 0;       // the lrs stepped by since the last synchronisation
  // (numel) once v is frozen, the weights at the last synchronisation (every rank's the same); before, scratch.
  torch::Tensor anchor_;
  bool anchored_ = false;  // anchor_ holds them (false after set_step_count until the next step)
};

}  // namespace

std::unique_ptr<FlatOptimizer> make_zero_one_adam(const ZeroOneAdamOptions& o, int64_t numel,
                                                  const torch::TensorOptions& state_options,
                                                  std::shared_ptr<Comm> comm) {
  check_adam_options(o.lr, o.betas, o.eps, o.weight_decay);
  require(o.var_freeze_step >= 0, "var_freeze_step", "must be >= 0", static_cast<double>(o.var_freeze_step));
  require(o.var_update_scaler >= 1, "var_update_scaler", "must be >= 1", static_cast<double>(o.var_update_scaler));
  require(o.local_step_scaler >= 1, "local_step_scaler", "must be >= 1", static_cast<double>(o.local_step_scaler));
  require(o.local_step_clipper >= 1, "local_step_clipper", "must be >= 1", static_cast<double>(o.local_step_clipper));
  return std::make_unique<ZeroOneAdam>(o, numel, state_options, std::move(comm));
}

}  // namespace dscpp::onebit
