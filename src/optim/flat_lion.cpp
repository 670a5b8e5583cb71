// Flat Lion on one fp32 partition (Chen et al. 2023; DeepSpeed FusedLion): the update is the sign of an
// interpolation of momentum and gradient, with decoupled weight decay. One state buffer instead of Adam's two.
#include <string>
#include <utility>
#include <vector>

#include "flat_optimizers.h"

namespace dscpp::detail {
namespace {

class FlatLion final : public FlatOptimizer {
 public:
  FlatLion(const LionOptions& options, int64_t numel, const torch::TensorOptions& state_options)
      : beta1_(options.betas[0]),
        beta2_(options.betas[1]),
        weight_decay_(options.weight_decay),
        numel_(numel),
        exp_avg_(torch::zeros({numel}, state_options)) {}

  void begin_step() override { ++steps_; }

  void update(const OptimizerSlice& slice, double lr) override {
    check_slice(slice, 1, "Lion");
    const double weight_decay = slice.weight_decay.value_or(weight_decay_);
    for_each_chunk(slice.param.numel(), [&](int64_t offset, int64_t length) {
      torch::Tensor p = slice.param.narrow(0, offset, length);
      torch::Tensor g = slice.grad.narrow(0, offset, length);
      torch::Tensor m = slice.state[0].narrow(0, offset, length);
      torch::Tensor update = scratch_.get(length, p);
      if (weight_decay != 0.0) p.mul_(1.0 - lr * weight_decay);
      update.copy_(m).mul_(beta1_).add_(g, 1.0 - beta1_).sign_();  // sign(b1*m + (1-b1)*g)
      p.add_(update, -lr);
      m.mul_(beta2_).add_(g, 1.0 - beta2_);  // the momentum tracks with beta2, after the update
    });
    write_param16(slice);
  }

  int64_t numel() const override { return numel_; }

  void set_betas(double beta1, double beta2) override {
    require(beta1 >= 0.0 && beta1 <= 1.0, "betas[0]", "(set by the schedule's momentum) must be in [0, 1]", beta1);
    require(beta2 >= 0.0 && beta2 <= 1.0, "betas[1]", "(set by the schedule's momentum) must be in [0, 1]", beta2);
    beta1_ = beta1;
    beta2_ = beta2;
  }

  std::vector<std::pair<std::string, torch::Tensor>> state_tensors() override { return {{"exp_avg", exp_avg_}}; }

  int64_t step_count() const override { return steps_; }
  void set_step_count(int64_t steps) override { steps_ = steps; }
  std::string name() const override { return "Lion"; }

 private:
  double beta1_;
  double beta2_;
  double weight_decay_;
  int64_t numel_;
  int64_t steps_ = 0;
  torch::Tensor exp_avg_;  // (numel) momentum
  Scratch scratch_;        // one chunk: the signed update
};

}  // namespace

std::unique_ptr<FlatOptimizer> make_flat_lion(const LionOptions& o, int64_t numel,
                                              const torch::TensorOptions& state_options) {
  require(o.lr >= 0.0, "lr", "must be >= 0", o.lr);
  require(o.betas[0] >= 0.0 && o.betas[0] <= 1.0, "betas[0]", "must be in [0, 1]", o.betas[0]);
  require(o.betas[1] >= 0.0 && o.betas[1] <= 1.0, "betas[1]", "must be in [0, 1]", o.betas[1]);
  require(o.weight_decay >= 0.0, "weight_decay", "must be >= 0", o.weight_decay);
  return std::make_unique<FlatLion>(o, numel, state_options);
}

}  // namespace dscpp::detail
