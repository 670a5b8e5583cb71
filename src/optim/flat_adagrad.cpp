// Flat Adagrad on one fp32 partition with torch.optim.Adagrad semantics: L2 weight decay, lr decayed as
// lr / (1 + (step-1)·lr_decay), a running sum of squared gradients that starts at initial_accumulator_value.
#include <string>
#include <utility>
#include <vector>

#include "flat_optimizers.h"

namespace dscpp::detail {
namespace {

class FlatAdagrad final : public FlatOptimizer {
 public:
  FlatAdagrad(const AdagradOptions& options, int64_t numel, const torch::TensorOptions& state_options)
      : initial_(options.initial_accumulator_value),
        lr_decay_(options.lr_decay),
        weight_decay_(options.weight_decay),
        eps_(options.eps),
        numel_(numel),
        sum_(torch::full({numel}, options.initial_accumulator_value, state_options)) {}

  void begin_step() override { ++steps_; }

  void update(const OptimizerSlice& slice, double lr) override {
    check_slice(slice, 1, "Adagrad");
    const double weight_decay = slice.weight_decay.value_or(weight_decay_);
    const double clr = lr / (1.0 + static_cast<double>(steps_ - 1) * lr_decay_);
    for_each_chunk(slice.param.numel(), [&](int64_t offset, int64_t length) {
      torch::Tensor p = slice.param.narrow(0, offset, length);
      torch::Tensor g = slice.grad.narrow(0, offset, length);
      torch::Tensor sum = slice.state[0].narrow(0, offset, length);
      torch::Tensor std = std_.get(length, p);
      if (weight_decay != 0.0) {
        torch::Tensor decayed = decayed_grad_.get(length, p);
        torch::add_out(decayed, g, p, weight_decay);  // g + wd * p
        g = decayed;
      }
      sum.addcmul_(g, g, 1.0);
      torch::sqrt_out(std, sum);
      std.add_(eps_);
      p.addcdiv_(g, std, -clr);
    });
    write_param16(slice);
  }

  int64_t numel() const override { return numel_; }

  void init_state(const std::vector<torch::Tensor>& state) const override {
    for (const auto& t : state) t.fill_(initial_);
  }

  std::vector<std::pair<std::string, torch::Tensor>> state_tensors() override { return {{"sum", sum_}}; }

  int64_t step_count() const override { return steps_; }
  void set_step_count(int64_t steps) override { steps_ = steps; }
  std::string name() const override { return "Adagrad"; }

 private:
  double initial_;
  double lr_decay_;
  double weight_decay_;
  double eps_;
  int64_t numel_;
  int64_t steps_ = 0;
  torch::Tensor sum_;           // (numel) running sum of squared gradients
  Scratch std_;                 // one chunk: sqrt(sum) + eps
  Scratch decayed_grad_;        // one chunk, only with weight decay
};

}  // namespace

std::unique_ptr<FlatOptimizer> make_flat_adagrad(const AdagradOptions& o, int64_t numel,
                                                 const torch::TensorOptions& state_options) {
  require(o.lr >= 0.0, "lr", "must be >= 0", o.lr);
  require(o.lr_decay >= 0.0, "lr_decay", "must be >= 0", o.lr_decay);
  require(o.weight_decay >= 0.0, "weight_decay", "must be >= 0", o.weight_decay);
  require(o.initial_accumulator_value >= 0.0, "initial_accumulator_value", "must be >= 0",
          o.initial_accumulator_value);
  require(o.eps >= 0.0, "eps", "must be >= 0", o.eps);
  return std::make_unique<FlatAdagrad>(o, numel, state_options);
}

}  // namespace dscpp::detail
