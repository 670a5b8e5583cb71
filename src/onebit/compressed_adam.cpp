// CompressedAdam (compressed_adam.h): the state and arithmetic the 1-bit optimizers share.
#include "compressed_adam.h"

#include <stdexcept>

#include "onebit_common.h"

namespace dscpp::onebit {

CompressedAdam::CompressedAdam(std::string name, const std::array<double, 2>& betas, double eps, double weight_decay,
                               int64_t numel, const torch::TensorOptions& state_options, std::shared_ptr<Comm> comm)
    : beta1_(betas[0]),
      beta2_(betas[1]),
      eps_(eps),
      weight_decay_(weight_decay),
      exp_avg_(torch::zeros({numel}, state_options)),
      exp_avg_sq_(torch::zeros({numel}, state_options)),
      name_(std::move(name)),
      comm_(std::move(comm)),
      numel_(numel) {
  if (comm_->world_size() > 1) errors_ = CompressionErrors::zeros(numel, comm_->world_size(), state_options);
}

// DeepSpeed's arithmetic: update = m / (√v + ε); update += wd·p; p += −lr·update.
void CompressedAdam::update(const OptimizerSlice& slice, double lr) {
  torch::NoGradGuard no_grad;
  const double weight_decay = slice.weight_decay.value_or(weight_decay_);
  detail::for_each_chunk(slice.param.numel(), [&](int64_t offset, int64_t length) {
    auto p = slice.param.narrow(0, offset, length);
    auto update = update_.get(length, p);
    torch::sqrt_out(update, slice.state[1].narrow(0, offset, length));
    update.add_(eps_);
    torch::div_out(update, slice.state[0].narrow(0, offset, length), update);
    if (weight_decay > 0.0) {
      auto decay = decay_.get(length, p);
      torch::mul_out(decay, p, weight_decay);
      update.add_(decay);
    }
    p.add_(update.mul_(-lr));
  });
}

void CompressedAdam::set_betas(double beta1, double beta2) {
  require(beta1 >= 0.0 && beta1 < 1.0, "betas[0]", "(set by the schedule's momentum) must be in [0, 1)", beta1);
  require(beta2 >= 0.0 && beta2 < 1.0, "betas[1]", "(set by the schedule's momentum) must be in [0, 1)", beta2);
  beta1_ = beta1;
  beta2_ = beta2;
}

std::vector<std::pair<std::string, torch::Tensor>> CompressedAdam::state_tensors() {
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
}

std::vector<std::pair<std::string, torch::Tensor>> CompressedAdam::rank_state() {
  if (!errors_.worker.defined()) return {};
  return {{"worker_error", errors_.worker}, {"server_error", errors_.server}};
}

void CompressedAdam::check_step(const torch::Tensor& param, const torch::Tensor& grad) const {
  if (param.numel() != numel_ || grad.numel() != numel_) {
    throw std::invalid_argument(name_ + " step: param and grad must have the partition's " + std::to_string(numel_) +
                                " elements, got " + std::to_string(param.numel()) + " and " +
                                std::to_string(grad.numel()));
  }
}

void CompressedAdam::reset_errors() {
  if (!errors_.worker.defined()) return;
  errors_.worker.zero_();
  errors_.server.zero_();
}

void CompressedAdam::compress(torch::Tensor& buffer) {
  if (comm_->world_size() > 1) compressed_all_reduce(*comm_, buffer, errors_);
}

}  // namespace dscpp::onebit
