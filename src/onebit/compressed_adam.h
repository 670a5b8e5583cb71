// Private to src/onebit: CompressedAdam, what 1-bit Adam and 0/1 Adam share — Adam's m and v over the whole
// partition, the compressed all-reduce and its error feedback (checkpointed per rank), DeepSpeed's betas, eps and
// weight decay, the step count, and DeepSpeed's move p += −lr·(m / (√v + ε) + wd·p), op for op. Each subclass is
// one schedule: its step() decides which buffer is averaged, exactly or compressed, and when p moves.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/comm/comm.h"
#include "dscpp/comm/compressed_allreduce.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/optim/update_helpers.h"

namespace dscpp::onebit {

class CompressedAdam : public FlatOptimizer {
 public:
  // DeepSpeed allocates its error feedback when compression starts and holds it from then on, most of a run; it is
  // allocated here (more than one rank) so that a checkpoint has it to fill whatever the phase.
  CompressedAdam(std::string name, const std::array<double, 2>& betas, double eps, double weight_decay, int64_t numel,
                 const torch::TensorOptions& state_options, std::shared_ptr<Comm> comm);

  void begin_step() override { ++steps_; }
  // p moves by m for one range of the partition, with its group's weight decay and lr (update_at calls it).
  void update(const OptimizerSlice& slice, double lr) override;

  // A schedule cycling momentum (OneCycle) moves the betas, which DeepSpeed's optimizers read at every step.
  void set_betas(double beta1, double beta2) override;
  int64_t numel() const override { return numel_; }
  std::vector<std::pair<std::string, torch::Tensor>> state_tensors() override;
  std::vector<std::pair<std::string, torch::Tensor>> rank_state() override;
  int64_t step_count() const override { return steps_; }
  void set_step_count(int64_t steps) override { steps_ = steps; }
  std::string name() const override { return name_; }

 protected:
  // std::invalid_argument unless param and grad have the partition's size.
  void check_step(const torch::Tensor& param, const torch::Tensor& grad) const;
  // Replaces `buffer` by its average over the ranks, 1-bit compressed (on one rank: left as it is, DeepSpeed's
  // size-1 rule).
  void compress(torch::Tensor& buffer);
  bool one_rank() const { return comm_->world_size() == 1; }
  // The error feedback back to zero (0/1 Adam when its variance freezes: the gradients' feedback is no use to the
  // updates').
  void reset_errors();

  double beta1_, beta2_;
  const double eps_, weight_decay_;
  int64_t steps_ = 0;
  torch::Tensor exp_avg_;     // (numel) m: the same on every rank, but between 0/1 Adam's synchronisations
  torch::Tensor exp_avg_sq_;  // (numel) v, frozen once the schedule says so

 private:
  const std::string name_;
  std::shared_ptr<Comm> comm_;
  const int64_t numel_;
  CompressionErrors errors_;
  detail::Scratch update_, decay_;  // one chunk each
};

}  // namespace dscpp::onebit
