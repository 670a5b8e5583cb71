// 1-bit LAMB (onebit_optimizer.h gives the schedule): DeepSpeed's lamb.py op for op, tensor by tensor over the
// partition's tensors (FlatOptimizer::partition_tensors; without them the partition is one tensor), each with its
// parameter group's lr and weight decay. One change: a tensor whose momentum is all zero when compression starts
// gets the scaling coefficient 1, where DeepSpeed's divides by its zero norm (a ZeroDivisionError).
#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "compressed_adam.h"
#include "onebit_common.h"

namespace dscpp::onebit {
namespace {

class OneBitLamb final : public CompressedAdam {
 public:
  OneBitLamb(const OneBitLambOptions& o, int64_t numel, const torch::TensorOptions& state_options,
             std::shared_ptr<Comm> comm)
      : CompressedAdam("OneBitLamb", o.betas, o.eps, o.weight_decay, numel, state_options, std::move(comm)),
        o_(o),
        exp_avg_sq_fresh_(torch::zeros({numel}, state_options)) {}

  void step(torch::Tensor& param, const torch::Tensor& grad, double lr) override {
    check_step(param, grad);
    torch::NoGradGuard no_grad;
    begin_step();
    if (steps_ == 1) return;  // DeepSpeed's set-up step: its buffers are made and nothing moves
    const auto ranges = tensor_ranges();
    per_tensor();  // sized for this model's tensors before either phase writes it
    if (compressing(steps_)) {
      compressed_step(param, grad, lr, ranges);
    } else {
      warm_up_step(param, grad, lr, ranges);
    }
  }

  bool wants_local_gradients() const override { return compressing(steps_ + 1); }

  void update(const OptimizerSlice&, double) override {
    throw std::logic_error("OneBitLamb is stepped whole (step()): its trust ratios need each tensor's norms");
  }

  std::vector<std::pair<std::string, torch::Tensor>> state_tensors() override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}, {"exp_avg_sq_fresh", exp_avg_sq_fresh_}};
  }

  // Per tensor, the same on every rank and for any world size: DeepSpeed's per-parameter lamb_coeff_freeze,
  // last_factor and scaling_coeff (0 until compression starts).
  std::vector<std::pair<std::string, torch::Tensor>> replicated_state() override {
    per_tensor();
    return {{"lamb_coeff_freeze", coeff_freeze_}, {"last_factor", last_factor_}, {"scaling_coeff", scaling_coeff_}};
  }

 private:
  // Step `step` compresses: as 1-bit Adam, from max(freeze_step, 2) + 1 (DeepSpeed freezes at the end of the first
  // step >= freeze_step after its set-up step).
  bool compressing(int64_t step) const { return step > std::max<int64_t>(o_.freeze_step, 2); }

  std::vector<TensorRange> tensor_ranges() const {
    const auto& tensors = partition_tensors();
    if (tensors.ranges.empty() && tensors.tensor_count == 0) return {{0, numel(), 0}};
    return tensors.ranges;
  }

  // The per-tensor state, allocated (lamb_coeff_freeze 0, last_factor 1, scaling_coeff unset) once the tensor count
  // is known: the engine gives it after construction.
  void per_tensor() {
    const auto& tensors = partition_tensors();
    const int64_t count = tensors.ranges.empty() && tensors.tensor_count == 0 ? 1 : tensors.tensor_count;
    if (coeff_freeze_.defined() && coeff_freeze_.numel() == count) return;
    const auto options = torch::TensorOptions().dtype(torch::kFloat64);
    coeff_freeze_ = torch::zeros({count}, options);
    last_factor_ = torch::ones({count}, options);
    scaling_coeff_ = torch::zeros({count}, options);
  }

  // LAMB without bias correction on the averaged gradient; each tensor's ratio also averaged into lamb_coeff_freeze.
  void warm_up_step(torch::Tensor& param, const torch::Tensor& grad, double lr,
                    const std::vector<TensorRange>& ranges) {
    exp_avg_.mul_(beta1_).add_(grad, 1.0 - beta1_);
    exp_avg_sq_.mul_(beta2_).addcmul_(grad, grad, 1.0 - beta2_);
    if (steps_ == o_.freeze_step) exp_avg_sq_fresh_.copy_(exp_avg_sq_);
    auto* coeff_freeze = coeff_freeze_.data_ptr<double>();
    for (const auto& r : ranges) {
      if (r.numel == 0) continue;
      auto p = param.narrow(0, r.begin, r.numel);
      const GroupSettings group = group_at(r.begin);
      const double decay = group.weight_decay.value_or(weight_decay_);
      const auto weight_norm = p.pow(2).sum().sqrt();
      auto update = exp_avg_.narrow(0, r.begin, r.numel) / (exp_avg_sq_.narrow(0, r.begin, r.numel).sqrt() + eps_);
      if (decay > 0.0) update += decay * p;
      const auto update_norm = update.pow(2).sum().sqrt();
      double coeff = 1.0;
      if (weight_norm.item<float>() != 0.0f && update_norm.item<float>() != 0.0f) {
        coeff = std::min(std::max((weight_norm / update_norm).item<double>(), o_.min_coeff), o_.max_coeff);
      }
      if (coeff != 1.0) {
        coeff_freeze[r.tensor] = o_.coeff_beta * coeff_freeze[r.tensor] + (1.0 - o_.coeff_beta) * coeff;
      }
      p.add_(-group.lr.value_or(lr) * coeff * update);
    }
  }

  // Each rank's own gradient into m, m averaged 1-bit compressed (each tensor scaled to the common magnitude for the
  // exchange), and each tensor moved by the frozen ratio times a factor from the fresh variance.
  void compressed_step(torch::Tensor& param, const torch::Tensor& grad, double lr,
                       const std::vector<TensorRange>& ranges) {
    const auto exp_avg_last = exp_avg_.clone();
    auto* scaling = scaling_coeff_.data_ptr<double>();
    if (std::all_of(ranges.begin(), ranges.end(), [&](const TensorRange& r) { return scaling[r.tensor] == 0.0; })) {
      set_scaling_coeffs(ranges);
    }
    exp_avg_.mul_(beta1_).add_(grad, 1.0 - beta1_);
    for (const auto& r : ranges) exp_avg_.narrow(0, r.begin, r.numel).mul_(scaling[r.tensor]);
    compress(exp_avg_);
    for (const auto& r : ranges) exp_avg_.narrow(0, r.begin, r.numel).div_(scaling[r.tensor]);

    const auto* coeff_freeze = coeff_freeze_.data_ptr<double>();
    auto* last_factor = last_factor_.data_ptr<double>();
    for (const auto& r : ranges) {
      if (r.numel == 0) continue;
      auto p = param.narrow(0, r.begin, r.numel);
      const auto m = exp_avg_.narrow(0, r.begin, r.numel);
      auto v_fresh = exp_avg_sq_fresh_.narrow(0, r.begin, r.numel);
      const GroupSettings group = group_at(r.begin);
      const double decay = group.weight_decay.value_or(weight_decay_);

      const auto grad_reconstruct = (m - exp_avg_last.narrow(0, r.begin, r.numel) * beta1_) / (1.0 - beta1_);
      v_fresh.mul_(beta2_).addcmul_(grad_reconstruct, grad_reconstruct, 1.0 - beta2_);
      const auto denom = exp_avg_sq_.narrow(0, r.begin, r.numel).sqrt() + eps_;
      const auto update_prelim = m / denom;
      const auto update = decay > 0.0 ? update_prelim + decay * p : update_prelim;
      const auto update_norm = update.pow(2).sum().sqrt();
      const auto denom_real = v_fresh.sqrt() + eps_;
      double factor = (denom / denom_real).max().item<double>();
      if (decay > 0.0) {
        // 1 when the update's norm is 0 (DeepSpeed's min(1.0, nan)).
        const double ratio = std::min(1.0, (update_prelim.pow(2).sum().sqrt() / update_norm).item<double>());
        factor = factor * ratio + (1.0 - ratio);
      }
      factor = std::max(std::min(factor, o_.factor_max), o_.factor_min);
      factor = std::min(factor, last_factor[r.tensor] * (1.0 + o_.factor_threshold));
      factor = std::max(factor, last_factor[r.tensor] * (1.0 - o_.factor_threshold));
      last_factor[r.tensor] = factor;
      p.add_(-group.lr.value_or(lr) * (coeff_freeze[r.tensor] * factor) * update);
    }
  }

  // At the first compressed step: each tensor's momentum scaled to the tensors' mean RMS, so that one sign scale
  // per chunk suits all of them. Empty tensors count for nothing, as DeepSpeed filters them out.
  void set_scaling_coeffs(const std::vector<TensorRange>& ranges) {
    std::vector<double> rms(ranges.size(), 0.0);
    double total = 0.0;
    int64_t counted = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const auto& r = ranges[i];
      if (r.numel == 0) continue;
      ++counted;
      rms[i] = (torch::linalg_vector_norm(exp_avg_.narrow(0, r.begin, r.numel), 2, c10::nullopt, false,
                                          c10::nullopt) /
                std::sqrt(static_cast<double>(r.numel)))
                   .item<double>();
      total += rms[i];
    }
    const double united = counted > 0 ? total / static_cast<double>(counted) : 0.0;
    auto* scaling = scaling_coeff_.data_ptr<double>();
    for (size_t i = 0; i < ranges.size(); ++i) scaling[ranges[i].tensor] = rms[i] > 0.0 ? united / rms[i] : 1.0;
  }

  const OneBitLambOptions o_;
  torch::Tensor exp_avg_sq_fresh_;  // (numel) the variance the frozen one is compared with, updated from m
  torch::Tensor coeff_freeze_, last_factor_, scaling_coeff_;  // (tensors) fp64 on the host, as DeepSpeed's floats
};

}  // namespace

std::unique_ptr<FlatOptimizer> make_onebit_lamb(const OneBitLambOptions& o, int64_t numel,
                                                const torch::TensorOptions& state_options,
                                                std::shared_ptr<Comm> comm) {
  check_adam_options(o.lr, o.betas, o.eps, o.weight_decay);
  require(o.freeze_step >= 0, "freeze_step", "must be >= 0", static_cast<double>(o.freeze_step));
  require(o.min_coeff > 0.0 && o.min_coeff <= o.max_coeff, "min_coeff", "must be in (0, max_coeff]", o.min_coeff);
  require(o.coeff_beta >= 0.0 && o.coeff_beta < 1.0, "coeff_beta", "must be in [0, 1)", o.coeff_beta);
  require(o.factor_min > 0.0 && o.factor_min <= o.factor_max, "factor_min", "must be in (0, factor_max]",
          o.factor_min);
  require(o.factor_threshold >= 0.0 && o.factor_threshold < 1.0, "factor_threshold", "must be in [0, 1)",
          o.factor_threshold);
  return std::make_unique<OneBitLamb>(o, numel, state_options, std::move(comm));
}

}  // namespace dscpp::onebit
