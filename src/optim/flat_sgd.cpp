// Flat SGD on one fp32 partition with torch.optim.SGD semantics: L2 weight decay, a momentum buffer that
// starts as a copy of the first gradient, dampening, and Nesterov momentum.
#include <string>
#include <utility>
#include <vector>

#include "flat_optimizers.h"

namespace dscpp::detail {
namespace {

class FlatSgd final : public FlatOptimizer {
 public:
  FlatSgd(const SgdOptions& options, int64_t numel, const torch::TensorOptions& state_options)
      : momentum_(options.momentum),
        dampening_(options.dampening),
        weight_decay_(options.weight_decay),
        nesterov_(options.nesterov),
        numel_(numel) {
    // Plain SGD keeps no state: the buffer exists only when momentum is used (4 bytes per parameter).
    if (momentum_ != 0.0) momentum_buffer_ = torch::zeros({numel}, state_options);
  }

  // The first step with momentum starts the buffer from the gradient (every slice of this step does).
  void begin_step() override {
    fresh_this_step_ = buffer_fresh_;
    if (momentum_ != 0.0) buffer_fresh_ = false;
    ++steps_;
  }

  void update(const OptimizerSlice& slice, double lr) override {
    check_slice(slice, momentum_buffer_.defined() ? 1 : 0, "SGD");
    const double weight_decay = slice.weight_decay.value_or(weight_decay_);
    for_each_chunk(slice.param.numel(), [&](int64_t offset, int64_t length) {
      torch::Tensor p = slice.param.narrow(0, offset, length);
      torch::Tensor d_p = slice.grad.narrow(0, offset, length);
      if (weight_decay != 0.0) {
        torch::Tensor scratch = scratch_.get(length, p);
        torch::add_out(scratch, d_p, p, weight_decay);  // g + wd * p
        d_p = scratch;
      }
      if (momentum_ != 0.0) {
        torch::Tensor buf = slice.state[0].narrow(0, offset, length);
        if (fresh_this_step_) {
          buf.copy_(d_p);  // torch: the first step's buffer is the gradient itself, undampened
        } else {
          buf.mul_(momentum_).add_(d_p, 1.0 - dampening_);
        }
        if (nesterov_) {
          torch::Tensor scratch = scratch_.get(length, p);
          torch::add_out(scratch, d_p, buf, momentum_);  // g + momentum * buf (scratch may alias d_p)
          d_p = scratch;
        } else {
          d_p = buf;
        }
      }
      p.add_(d_p, -lr);
    });
    write_param16(slice);
  }

  int64_t numel() const override { return numel_; }

  std::vector<std::pair<std::string, torch::Tensor>> state_tensors() override {
    if (!momentum_buffer_.defined()) return {};
    return {{"momentum_buffer", momentum_buffer_}};
  }

  int64_t step_count() const override { return steps_; }

  // A restored buffer (steps > 0) continues; at step 0 the next gradient initialises it.
  void set_step_count(int64_t steps) override {
    steps_ = steps;
    buffer_fresh_ = steps == 0;
  }

  std::string name() const override { return "SGD"; }

 private:
  double momentum_;
  double dampening_;
  double weight_decay_;
  bool nesterov_;
  int64_t numel_;
  int64_t steps_ = 0;
  bool buffer_fresh_ = true;       // the buffer holds no history yet
  bool fresh_this_step_ = true;    // buffer_fresh_ as the current step began
  torch::Tensor momentum_buffer_;  // (numel), only when momentum != 0
  Scratch scratch_;                // one chunk, for weight decay or Nesterov
};

}  // namespace

std::unique_ptr<FlatOptimizer> make_flat_sgd(const SgdOptions& o, int64_t numel,
                                             const torch::TensorOptions& state_options) {
  require(o.lr >= 0.0, "lr", "must be >= 0", o.lr);
  require(o.momentum >= 0.0, "momentum", "must be >= 0", o.momentum);
  require(o.weight_decay >= 0.0, "weight_decay", "must be >= 0", o.weight_decay);
  if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
    std::ostringstream msg;
    msg << "optimizer.params.nesterov requires momentum > 0 and dampening == 0, got momentum " << o.momentum
        << ", dampening " << o.dampening;
    throw std::invalid_argument(msg.str());
  }
  return std::make_unique<FlatSgd>(o, numel, state_options);
}

}  // namespace dscpp::detail
