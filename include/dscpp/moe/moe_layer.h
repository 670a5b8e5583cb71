// dscpp::moe::MoE — DeepSpeed's MoE layer (deepspeed.moe.layer.MoE) for LibTorch models: a gate and E experts in
// place of one MLP. Each token goes to k experts (gate.h's rules); with ep_size > 1 the experts are spread over the
// expert-parallel group and tokens travel to them and back by all-to-all.
//
// One forward: the TokenDispatcher (token_dispatcher.h) routes the tokens with the gate's weight and brings this
// rank's local experts their rows from every expert-parallel rank; local expert i runs on its rows; the dispatcher
// takes the outputs back and combines each token's kept choices, weighted.
//
// Parameter names are DeepSpeed's (deepspeed_moe.gate.wg.weight, deepspeed_moe.experts.deepspeed_experts.<i>.…,
// mlp.… and coefficient.… with use_residual), except that <i> is the expert's global index, not its index on this
// rank: a checkpoint then names every expert once, and loads under any ep_size.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/comm.h"
#include "dscpp/moe/gate.h"
#include "dscpp/moe/token_dispatcher.h"

namespace dscpp::moe {

struct MoEOptions {
  int64_t hidden_size = 0;
  int64_t num_experts = 1;
  int ep_size = 1;
  GateOptions gate;          // k, capacity factors, min_capacity, noisy_gate_policy, drop_tokens, use_rts, …
  bool use_residual = false;  // Residual-MoE: a dense MLP (the expert module itself) mixed in by a learned coefficient
};

// What forward returns, as DeepSpeed's (output, l_aux, exp_counts).
struct MoEOutput {
  torch::Tensor output;      // shaped like the input
  torch::Tensor l_aux;       // 0-dim fp32: the load-balancing loss (add coeff · l_aux to the model's loss)
  torch::Tensor exp_counts;  // (num_experts) int64: this rank's tokens sent to each expert
};

class MoEImpl : public torch::nn::Module {
 public:
  // `expert` is deep-copied (clone()) for every local expert, so it must be a torch::nn::Cloneable; with
  // use_residual it is also the dense MLP. `ep_group`: the expert-parallel group (ExpertGroups::expert_parallel),
  // of size ep_size; null for ep_size 1. std::invalid_argument naming the numbers for num_experts not divisible by
  // ep_size, a group of another size, fewer experts than k, and any GateOptions::validate error.
  MoEImpl(const MoEOptions& options, torch::nn::AnyModule expert, std::shared_ptr<Comm> ep_group = nullptr);

  // hidden_states (…, hidden_size).
  MoEOutput forward(const torch::Tensor& hidden_states);

  const MoEOptions& options() const { return options_; }
  int64_t num_local_experts() const { return dispatcher_->num_local_experts(); }
  int64_t first_local_expert() const { return dispatcher_->first_local_expert(); }  // global index of local expert 0
  // This rank's experts' parameters, named relative to this module (deepspeed_moe.experts.deepspeed_experts.<i>.…).
  std::vector<std::pair<std::string, torch::Tensor>> expert_parameters() const;
  // Seconds this layer has spent in its all-to-alls (forward and backward) since it was built.
  double all_to_all_seconds() const { return dispatcher_->all_to_all_seconds(); }

  torch::nn::Linear wg{nullptr};           // the gate: (num_experts, hidden_size), no bias
  std::vector<torch::nn::AnyModule> experts;  // local experts, in global order
  torch::nn::AnyModule mlp;                // use_residual
  torch::nn::Linear coefficient{nullptr};  // use_residual: (2, hidden_size)

 private:
  MoEOptions options_;
  std::shared_ptr<TokenDispatcher> dispatcher_;
  std::vector<std::string> expert_prefixes_;  // "deepspeed_moe.experts.deepspeed_experts.<i>."
};
TORCH_MODULE(MoE);

// The expert parameters of every MoE layer in `model`, by their full names in model.named_parameters(): the
// parameters averaged over the expert-data-parallel group rather than the data-parallel group (DeepSpeed's
// is_moe_param).
std::vector<std::string> expert_parameter_names(const torch::nn::Module& model);
// The largest ep_size among `model`'s MoE layers; 1 without any.
int expert_parallel_size(const torch::nn::Module& model);

}  // namespace dscpp::moe
