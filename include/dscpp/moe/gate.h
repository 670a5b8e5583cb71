// The MoE gate's routing rules (DeepSpeed's top1gating / top2gating, after GShard): which expert(s) each token goes
// to, at which slot of the expert's capacity, with which weight, and the auxiliary load-balancing loss.
//
// Rules, for S tokens and E experts, gates = softmax(logits):
//   capacity   ceil(S / E · factor) (top-2: factor doubled), at least min_capacity. Without drop_tokens, the largest
//              number of tokens any expert was sent (the largest over the expert-parallel group, so every rank's
//              all-to-all chunks agree; top-1 at most S).
//   top-1      each token's expert is argmax(gates) (RSample: argmax(logits + Gumbel noise)). Over capacity, an expert
//              keeps the `capacity` tokens torch.topk picks down its column of the one-hot mask: times a uniform draw
//              with use_rts (Random Token Selection: the largest draws), the 0/1 mask itself without (topk's choice
//              among equals). Weight: the token's gate value for its expert.
//   top-2      the first expert as top-1; the second is argmax of the logits without the first (with Gumbel noise
//              added when top2_2nd_expert_sampling). Slots are given in token order, every first choice before any
//              second choice; choices past the capacity are dropped. Weights: the two gate values, divided by their
//              sum (of the kept ones).
//   l_aux      E · Σ_e mean_s(gates)_e · mean_s(first-choice mask)_e, before any token is dropped (DeepSpeed's top-2
//              writes it as the mean over experts times E²: the same value).
//   exp_counts tokens sent to each expert (both choices) before capacity dropped any.
// Top-1's topk is DeepSpeed's own op on the same tensor, so the same torch keeps the same tokens
// (tests/conformance/test_training.py holds it against DeepSpeed).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

#include "dscpp/comm/comm.h"

namespace dscpp::moe {

enum class NoisyGatePolicy { kNone, kJitter, kRSample };
// "None", "Jitter", "RSample" (DeepSpeed's names); std::invalid_argument naming the allowed ones otherwise.
NoisyGatePolicy parse_noisy_gate_policy(const std::string& name);
const char* to_string(NoisyGatePolicy policy);

// DeepSpeed's MoE layer options for its gate, with MoE's defaults.
struct GateOptions {
  int k = 1;                          // experts per token: 1 or 2
  double capacity_factor = 1.0;       // training
  double eval_capacity_factor = 1.0;  // evaluation (the module not in training mode)
  int64_t min_capacity = 4;
  // Training only. Jitter multiplies the gate's input by U(0.99, 1.01) (the layer applies it); RSample adds Gumbel
  // noise to top-1's logits for the choice.
  NoisyGatePolicy noisy_gate_policy = NoisyGatePolicy::kNone;
  bool drop_tokens = true;
  bool use_rts = true;                    // top-1 only
  bool top2_2nd_expert_sampling = true;   // top-2 only
  // std::invalid_argument naming the option and the value: k not 1 or 2, a capacity factor <= 0, min_capacity < 0.
  void validate() const;
};

// One gating decision, kept sparse: for choice c (0 ≤ c < k) of token s, the expert, the slot in its capacity and
// the weight (0 and slot 0 where the choice was dropped). combine_weights() and dispatch_mask() give DeepSpeed's
// dense (S, E, C) forms from it.
struct Routing {
  torch::Tensor expert;    // (k, S) int64
  torch::Tensor location;  // (k, S) int64: slot in [0, capacity)
  torch::Tensor kept;      // (k, S) bool: within the capacity
  torch::Tensor weight;    // (k, S) fp32, differentiable with respect to the logits
  torch::Tensor l_aux;     // 0-dim fp32, differentiable with respect to the logits
  torch::Tensor exp_counts;  // (E) int64
  int64_t num_experts = 0;
  int64_t capacity = 0;

  torch::Tensor combine_weights() const;  // (S, E, C) fp32: weight at [s, expert, location] of each kept choice
  torch::Tensor dispatch_mask() const;    // (S, E, C) bool: combine_weights() != 0
};

// ceil(tokens / experts · factor), at least min_capacity (DeepSpeed's _capacity).
int64_t expert_capacity(int64_t tokens, int64_t experts, double factor, int64_t min_capacity);

// The routing of `logits` (S, E), fp32. `ep_group` (may be null: one rank) agrees the capacity without drop_tokens.
// `training` picks the capacity factor and whether RSample's noise applies, as the module's training flag does in
// DeepSpeed (RTS and 2nd-expert sampling apply in both). Random draws come from the default generator.
// std::invalid_argument for logits that are not (S, E) with E >= k, and, with top-1, fewer tokens than min_capacity
// (as DeepSpeed asserts).
Routing route(const torch::Tensor& logits, const GateOptions& options, bool training, Comm* ep_group = nullptr);

}  // namespace dscpp::moe
