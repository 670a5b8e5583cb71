// Flat Adam / AdamW on one fp32 partition: torch.optim.AdamW / DeepSpeed FusedAdam arithmetic with in-place
// torch ops, so it runs on any device; with OptimizerKernels::kCpuSimd (offload) host slices go through the fused
// SIMD CPU Adam instead, which also writes the 16-bit copy in the same pass; with OptimizerKernels::kFused (the
// master on a GPU) through torch's fused Adam kernel. AMSGrad (torch.optim's rule: the denominator uses the running
// maximum of the second moment) keeps a third state tensor; the SIMD kernel has no AMSGrad, torch's fused one has.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/optim/cpu_adam.h"
#include "flat_optimizers.h"

namespace dscpp::detail {
namespace {

class FlatAdam final : public FlatOptimizer {
 public:
  FlatAdam(const AdamOptions& options, bool decoupled, std::string name, int64_t numel,
           const torch::TensorOptions& state_options, OptimizerKernels kernels)
      : beta1_(options.betas[0]),
        beta2_(options.betas[1]),
        eps_(options.eps),
        weight_decay_(options.weight_decay),
        decoupled_(decoupled),
        bias_correction_(options.bias_correction),
        amsgrad_(options.amsgrad),
        kernels_(kernels),
        name_(std::move(name)),
        numel_(numel),
        exp_avg_(torch::zeros({numel}, state_options)),
        exp_avg_sq_(torch::zeros({numel}, state_options)) {
    if (amsgrad_) max_exp_avg_sq_ = torch::zeros({numel}, state_options);
  }

  void begin_step() override { ++steps_; }

  void update(const OptimizerSlice& slice, double lr) override {
    check_slice(slice, amsgrad_ ? 3 : 2, name_);
    if (kernels_ == OptimizerKernels::kCpuSimd && !amsgrad_ && on_host(slice)) return update_simd(slice, lr);
    if (kernels_ == OptimizerKernels::kFused && bias_correction_) return update_fused(slice, lr);
    const double bias_correction1 = bias_correction_ ? 1.0 - std::pow(beta1_, static_cast<double>(steps_)) : 1.0;
    const double bias_correction2 = bias_correction_ ? 1.0 - std::pow(beta2_, static_cast<double>(steps_)) : 1.0;
    const double step_size = lr / bias_correction1;
    const double sqrt_bias_correction2 = std::sqrt(bias_correction2);
    const double weight_decay = slice.weight_decay.value_or(weight_decay_);
    const bool l2 = weight_decay != 0.0 && !decoupled_;

    for_each_chunk(slice.param.numel(), [&](int64_t offset, int64_t length) {
      torch::Tensor p = slice.param.narrow(0, offset, length);
      torch::Tensor g = slice.grad.narrow(0, offset, length);
      torch::Tensor m = slice.state[0].narrow(0, offset, length);
      torch::Tensor v = slice.state[1].narrow(0, offset, length);
      torch::Tensor scratch = scratch_.get(length, p);
      if (weight_decay != 0.0 && decoupled_) p.mul_(1.0 - lr * weight_decay);
      if (l2) {
        torch::add_out(scratch, g, p, weight_decay);  // g + wd * p, without touching the caller's grad
        g = scratch;
      }
      m.mul_(beta1_).add_(g, 1.0 - beta1_);
      v.mul_(beta2_).addcmul_(g, g, 1.0 - beta2_);
      if (amsgrad_) {
        torch::Tensor v_max = slice.state[2].narrow(0, offset, length);
        torch::maximum_out(v_max, v_max, v);
        v = v_max;
      }
      // denom = sqrt(v) / sqrt(bc2) + eps; reuses the scratch (the L2 gradient is no longer needed).
      torch::sqrt_out(scratch, v);
      scratch.div_(sqrt_bias_correction2).add_(eps_);
      p.addcdiv_(m, scratch, -step_size);
    });
    write_param16(slice);
  }

  void set_betas(double beta1, double beta2) override {
    require(beta1 >= 0.0 && beta1 < 1.0, "betas[0]", "(set by the schedule's momentum) must be in [0, 1)", beta1);
    require(beta2 >= 0.0 && beta2 < 1.0, "betas[1]", "(set by the schedule's momentum) must be in [0, 1)", beta2);
    beta1_ = beta1;
    beta2_ = beta2;
  }

  int64_t numel() const override { return numel_; }

  std::vector<std::pair<std::string, torch::Tensor>> state_tensors() override {
    if (amsgrad_) return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}, {"max_exp_avg_sq", max_exp_avg_sq_}};
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }

  int64_t step_count() const override { return steps_; }
  void set_step_count(int64_t steps) override { steps_ = steps; }
  std::string name() const override { return name_; }

 private:
  // The SIMD kernel reads raw pointers: every slice must be contiguous host memory (the 16-bit copy bf16 or fp16).
  static bool on_host(const OptimizerSlice& s) {
    auto ok = [](const torch::Tensor& t) { return t.device().is_cpu() && t.is_contiguous(); };
    return ok(s.param) && ok(s.grad) && ok(s.state[0]) && ok(s.state[1]) &&
           (!s.param16.defined() || (ok(s.param16) && (s.param16.scalar_type() == torch::kBFloat16 ||
                                                       s.param16.scalar_type() == torch::kFloat16)));
  }

  void update_simd(const OptimizerSlice& s, double lr) {
    AdamStepConfig c;
    c.lr = lr;
    c.beta1 = beta1_;
    c.beta2 = beta2_;
    c.eps = eps_;
    c.weight_decay = s.weight_decay.value_or(weight_decay_);
    c.decoupled = decoupled_;
    c.bias_correction = bias_correction_;
    c.step = steps_;
    const bool fused16 = s.param16.defined();
    cpu_adam_step(c, s.param.data_ptr<float>(), s.grad.data_ptr<float>(), s.state[0].data_ptr<float>(),
                  s.state[1].data_ptr<float>(), s.param.numel(), fused16 ? s.param16.data_ptr() : nullptr,
                  fused16 ? s.param16.scalar_type() : torch::kBFloat16);
  }

  // torch's _fused_adamw_ (decoupled decay) or _fused_adam_ (L2: the gradient plus wd·p, inside the kernel; the
  // caller's gradient is not written without a grad_scale). Both apply bias correction from the step count they read
  // from a tensor on the parameters' device, and do not advance it.
  void update_fused(const OptimizerSlice& s, double lr) {
    if (!step_tensor_.defined() || step_tensor_.device() != s.param.device()) {
      step_tensor_ = torch::empty({}, s.param.options());
    }
    step_tensor_.fill_(static_cast<double>(steps_));
    const std::vector<torch::Tensor> p{s.param}, g{s.grad}, m{s.state[0]}, v{s.state[1]}, steps{step_tensor_};
    const std::vector<torch::Tensor> v_max = amsgrad_ ? std::vector<torch::Tensor>{s.state[2]}
                                                      : std::vector<torch::Tensor>{};
    const double weight_decay = s.weight_decay.value_or(weight_decay_);
    if (decoupled_) {
      at::_fused_adamw_(p, g, m, v, v_max, steps, lr, beta1_, beta2_, weight_decay, eps_, amsgrad_, /*maximize=*/false);
    } else {
      at::_fused_adam_(p, g, m, v, v_max, steps, lr, beta1_, beta2_, weight_decay, eps_, amsgrad_, /*maximize=*/false);
    }
    write_param16(s);
  }

  double beta1_;
  double beta2_;
  double eps_;
  double weight_decay_;
  bool decoupled_;          // AdamW: p *= 1 - lr*wd; else L2: g + wd*p
  bool bias_correction_;
  bool amsgrad_;
  OptimizerKernels kernels_;
  std::string name_;
  int64_t numel_;
  int64_t steps_ = 0;
  torch::Tensor exp_avg_;     // (numel) first moment
  torch::Tensor exp_avg_sq_;  // (numel) second moment
  torch::Tensor max_exp_avg_sq_;  // (numel) amsgrad: the running maximum of exp_avg_sq; undefined otherwise
  Scratch scratch_;           // one chunk: the L2 gradient, then the denominator
  torch::Tensor step_tensor_;  // kFused: the step count, as the fused kernels read it (a scalar on the device)
};

}  // namespace

std::unique_ptr<FlatOptimizer> make_flat_adam(const AdamOptions& o, bool decoupled, const std::string& name,
                                              int64_t numel, const torch::TensorOptions& state_options,
                                              OptimizerKernels kernels) {
  require(o.lr >= 0.0, "lr", "must be >= 0", o.lr);
  require(o.betas[0] >= 0.0 && o.betas[0] < 1.0, "betas[0]", "must be in [0, 1)", o.betas[0]);
  require(o.betas[1] >= 0.0 && o.betas[1] < 1.0, "betas[1]", "must be in [0, 1)", o.betas[1]);
  require(o.eps >= 0.0, "eps", "must be >= 0", o.eps);
  require(o.weight_decay >= 0.0, "weight_decay", "must be >= 0", o.weight_decay);
  return std::make_unique<FlatAdam>(o, decoupled, name, numel, state_options, kernels);
}

}  // namespace dscpp::detail
