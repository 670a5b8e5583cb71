// 1-bit Adam (onebit_optimizer.h gives the schedule), DeepSpeed's adam.py op for op on CompressedAdam's state.
#include <algorithm>
#include <memory>
#include <utility>

#include "compressed_adam.h"
#include "onebit_common.h"

namespace dscpp::onebit {
namespace {

class OneBitAdam final : public CompressedAdam {
 public:
  OneBitAdam(const OneBitAdamOptions& o, int64_t numel, const torch::TensorOptions& state_options,
             std::shared_ptr<Comm> comm)
      : CompressedAdam("OneBitAdam", o.betas, o.eps, o.weight_decay, numel, state_options, std::move(comm)),
        freeze_step_(o.freeze_step) {}

  void step(torch::Tensor& param, const torch::Tensor& grad, double lr) override {
    check_step(param, grad);
    torch::NoGradGuard no_grad;
    begin_step();
    if (steps_ == 1) return;  // DeepSpeed's first step sets up its buffers and updates nothing
    exp_avg_.mul_(beta1_).add_(grad, 1.0 - beta1_);  // the averaged gradient, or this rank's own once compressing
    if (compressing(steps_)) {
      compress(exp_avg_);
    } else {
      exp_avg_sq_.mul_(beta2_).addcmul_(grad, grad, 1.0 - beta2_);
    }
    update_at(OptimizerSlice{param, grad, {exp_avg_, exp_avg_sq_}, {}, std::nullopt}, 0, lr);
  }

  bool wants_local_gradients() const override { return compressing(steps_ + 1); }

 private:
  // Step `step` (from 1) compresses: DeepSpeed freezes at the end of the first step >= freeze_step after its set-up
  // step, so the first compressed step is max(freeze_step, 2) + 1.
  bool compressing(int64_t step) const { return step > std::max<int64_t>(freeze_step_, 2); }

  const int64_t freeze_step_;
};

}  // namespace

std::unique_ptr<FlatOptimizer> make_onebit_adam(const OneBitAdamOptions& o, int64_t numel,
                                                const torch::TensorOptions& state_options, std::shared_ptr<Comm> comm) {
  check_adam_options(o.lr, o.betas, o.eps, o.weight_decay);
  require(o.freeze_step >= 0, "freeze_step", "must be >= 0", static_cast<double>(o.freeze_step));
  return std::make_unique<OneBitAdam>(o, numel, state_options, std::move(comm));
}

}  // namespace dscpp::onebit
