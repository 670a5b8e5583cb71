// Flat Lamb on one fp32 partition: DeepSpeed's FusedLamb (options.h says what it computes), each model tensor with
// its own trust ratio. Where ZeRO splits a tensor over ranks, the two squared norms the ratio needs are summed over
// them first (PartitionTensors::sum_over_ranks), so every layout takes the ratio of whole tensors, as one process
// does. (DeepSpeed's ZeRO and bf16 optimizers hand FusedLamb each rank's flat partition as one parameter, so there
// its ratio is the partition's; docs/configuration.md lists the difference.)
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "flat_optimizers.h"

namespace dscpp::detail {
namespace {

class FlatLamb final : public FlatOptimizer {
 public:
  FlatLamb(const LambOptions& o, int64_t numel, const torch::TensorOptions& state_options)
      : options_(o),
        numel_(numel),
        exp_avg_(torch::zeros({numel}, state_options)),
        exp_avg_sq_(torch::zeros({numel}, state_options)) {}

  // Two passes over each tensor: its norms (summed over the ranks holding its pieces), then its move by the ratio.
  void step(torch::Tensor& param, const torch::Tensor& grad, double lr) override {
    if (param.numel() != numel_ || grad.numel() != numel_) {
      throw std::invalid_argument("Lamb step: param and grad must have the partition's " + std::to_string(numel_) +
                                  " elements, got " + std::to_string(param.numel()) + " and " +
                                  std::to_string(grad.numel()));
    }
    torch::NoGradGuard no_grad;
    begin_step();
    const double beta1 = options_.betas[0], beta2 = options_.betas[1];
    exp_avg_.mul_(beta1).add_(grad, 1.0 - beta1);
    exp_avg_sq_.mul_(beta2).addcmul_(grad, grad, 1.0 - beta2);

    const auto& tensors = partition_tensors();
    const bool whole = tensors.ranges.empty() && tensors.tensor_count == 0;
    const std::vector<TensorRange> ranges = whole ? std::vector<TensorRange>{{0, numel_, 0}} : tensors.ranges;
    const int64_t count = whole ? 1 : tensors.tensor_count;

    // Row 0: Σp², row 1: Σupdate², per tensor.
    auto sums = torch::zeros({2, count}, param.options());
    for (const auto& r : ranges) {
      const double decay = group_at(r.begin).weight_decay.value_or(options_.weight_decay);
      for_each_chunk(r.numel, [&](int64_t offset, int64_t length) {
        auto p = param.narrow(0, r.begin + offset, length);
        auto update = compute_update(r.begin + offset, length, p, decay);
        sums[0][r.tensor] += p.pow(2).sum();
        sums[1][r.tensor] += update.pow(2).sum();
      });
    }
    if (tensors.sum_over_ranks) tensors.sum_over_ranks(sums);
    const auto norms = sums.sqrt().cpu();
    const auto weight_norm = norms[0], update_norm = norms[1];

    double step_size_factor = 1.0;  // √(1−β2^t)/(1−β1^t) with bias correction
    if (options_.bias_correction) {
      const double t = static_cast<double>(steps_);
      step_size_factor = std::sqrt(1.0 - std::pow(beta2, t)) / (1.0 - std::pow(beta1, t));
    }
    for (const auto& r : ranges) {
      // The kernel's ratio: 1 where either norm is 0, else ‖p‖/‖update‖ clamped to [min_coeff, max_coeff].
      const float w = weight_norm[r.tensor].item<float>(), u = update_norm[r.tensor].item<float>();
      double coeff = 1.0;
      if (w != 0.0f && u != 0.0f) coeff = std::min(std::max(static_cast<double>(w / u), options_.min_coeff),
                                                   options_.max_coeff);
      const GroupSettings group = group_at(r.begin);
      const double decay = group.weight_decay.value_or(options_.weight_decay);
      const double step_size = group.lr.value_or(lr) * step_size_factor;
      for_each_chunk(r.numel, [&](int64_t offset, int64_t length) {
        auto p = param.narrow(0, r.begin + offset, length);
        p.add_(compute_update(r.begin + offset, length, p, decay), -step_size * coeff);
      });
    }
  }

  void begin_step() override { ++steps_; }

  void update(const OptimizerSlice&, double) override {
    throw std::logic_error(
        "Lamb is stepped whole (step()): each tensor's trust ratio needs its norms before any element moves, which "
        "a sliced update (offload) cannot give; the config check refuses Lamb with offload_optimizer");
  }

  int64_t numel() const override { return numel_; }

  void set_betas(double beta1, double beta2) override {
    require(beta1 >= 0.0 && beta1 < 1.0, "betas[0]", "(set by the schedule's momentum) must be in [0, 1)", beta1);
    require(beta2 >= 0.0 && beta2 < 1.0, "betas[1]", "(set by the schedule's momentum) must be in [0, 1)", beta2);
    options_.betas = {beta1, beta2};
  }

  std::vector<std::pair<std::string, torch::Tensor>> state_tensors() override {
    return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
  }

  int64_t step_count() const override { return steps_; }
  void set_step_count(int64_t steps) override { steps_ = steps; }
  std::string name() const override { return "Lamb"; }

 private:
  // m / (√v + ε) + wd·p (or m / √(v + ε) + wd·p) for partition elements [begin, begin + length), in scratch.
  torch::Tensor compute_update(int64_t begin, int64_t length, const torch::Tensor& p, double decay) {
    auto update = update_.get(length, p);
    const auto v = exp_avg_sq_.narrow(0, begin, length);
    if (options_.eps_inside_sqrt) {
      torch::add_out(update, v, options_.eps);
      update.sqrt_();
    } else {
      torch::sqrt_out(update, v);
      update.add_(options_.eps);
    }
    torch::div_out(update, exp_avg_.narrow(0, begin, length), update);
    if (decay > 0.0) update.add_(p, decay);
    return update;
  }

  LambOptions options_;
  const int64_t numel_;
  int64_t steps_ = 0;
  torch::Tensor exp_avg_;     // (numel) m
  torch::Tensor exp_avg_sq_;  // (numel) v
  Scratch update_;            // one chunk: the update
};

}  // namespace

std::unique_ptr<FlatOptimizer> make_flat_lamb(const LambOptions& o, int64_t numel,
                                              const torch::TensorOptions& state_options) {
  require(o.lr >= 0.0, "lr", "must be >= 0", o.lr);
  require(o.betas[0] >= 0.0 && o.betas[0] < 1.0, "betas[0]", "must be in [0, 1)", o.betas[0]);
  require(o.betas[1] >= 0.0 && o.betas[1] < 1.0, "betas[1]", "must be in [0, 1)", o.betas[1]);
  require(o.eps > 0.0, "eps", "must be > 0", o.eps);
  require(o.weight_decay >= 0.0, "weight_decay", "must be >= 0", o.weight_decay);
  require(o.min_coeff > 0.0 && o.min_coeff <= o.max_coeff, "min_coeff", "must be in (0, max_coeff]", o.min_coeff);
  return std::make_unique<FlatLamb>(o, numel, state_options);
}

}  // namespace dscpp::detail
