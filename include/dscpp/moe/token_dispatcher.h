// How an MoE layer's tokens reach its experts and come back: the gate's routing (gate.h), the dispatch by index, the
// all-to-all over the expert-parallel group there and back, and the weighted combine. It holds no parameters and
// runs no expert, so the C++ layer (moe_layer.h) and the Python one (dscpp.moe.layer.MoE, whose experts are Python
// modules) move tokens with this one implementation.
//
// For S tokens of width M, E experts over P expert-parallel ranks (L = E / P local experts), capacity C:
//   dispatch   logits = x·wgᵀ in fp32 → Routing; each kept choice's token is copied to row expert·C + slot of an
//              (E·C, M) buffer (zeros elsewhere); chunk j (the experts of expert-parallel rank j) goes to rank j, and
//              this rank receives its local experts' rows from every rank: (P, L, C, M)
//   experts    local expert i runs on [:, i] — (P, C, M), as DeepSpeed's Experts hands it its chunk
//   combine    the experts' (P, L, C, M) rows go back by the same exchange; each token's output is the weighted sum
//              of its kept choices' rows
// DeepSpeed dispatches and combines with einsums over dense (S, E, C) masks; moving rows by index gives the same sums
// without the S·E·C·M work. Every step is a differentiable torch op (the all-to-all through collective_op), so
// gradients reach the tokens, the gate weight and the experts by autograd.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "dscpp/comm/comm.h"
#include "dscpp/moe/gate.h"

namespace dscpp::moe {

// One forward's tokens on their way: what the local experts process, the gate's outputs, and what combine needs.
struct DispatchedTokens {
  torch::Tensor expert_inputs;  // (P, L, C, M): this rank's local experts' rows from every expert-parallel rank
  torch::Tensor l_aux;          // 0-dim fp32
  torch::Tensor exp_counts;     // (E) int64
  // Every choice of every token (k·S of them): its token, its row in the (E·C + 1, M) buffer — a dropped choice
  // takes the spare last row, which no expert reads — and its weight (0 when dropped).
  torch::Tensor source, row, weight;
  int64_t tokens = 0;
};

// std::invalid_argument naming the numbers for num_experts < 1, not divisible by ep_size, or fewer than k.
void check_expert_counts(int64_t num_experts, int ep_size, int k);

class TokenDispatcher {
 public:
  // `ep_group` of ep_size ranks (null: one rank, ep_size 1). std::invalid_argument from check_expert_counts (with
  // the group's size) and GateOptions::validate.
  TokenDispatcher(int64_t num_experts, const GateOptions& gate, std::shared_ptr<Comm> ep_group);

  // `tokens` (S, M) in the compute dtype; `gate_weight` (E, M) is used in fp32, as DeepSpeed's gate runs. `training`
  // picks the capacity factor and the noise (Jitter scales the gate's input by U(0.99, 1.01) here).
  DispatchedTokens dispatch(const torch::Tensor& tokens, const torch::Tensor& gate_weight, bool training);
  // `expert_outputs` (P, L, C, M'), the local experts' outputs in expert_inputs' layout → (S, M').
  torch::Tensor combine(const torch::Tensor& expert_outputs, const DispatchedTokens& dispatched);

  int64_t num_experts() const { return num_experts_; }
  int ep_size() const { return ep_group_->world_size(); }
  int64_t num_local_experts() const { return num_experts_ / ep_size(); }
  int64_t first_local_expert() const { return ep_group_->rank() * num_local_experts(); }  // its global index
  const GateOptions& gate() const { return gate_; }
  // Seconds spent in this dispatcher's all-to-alls (forward and backward) since it was built.
  double all_to_all_seconds() const { return static_cast<double>(all_to_all_ns_->load()) * 1e-9; }

 private:
  torch::Tensor exchange(const torch::Tensor& rows);

  int64_t num_experts_;
  GateOptions gate_;
  std::shared_ptr<Comm> ep_group_;
  // Shared with the backward nodes, which may outlive the dispatcher.
  std::shared_ptr<std::atomic<int64_t>> all_to_all_ns_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace dscpp::moe
