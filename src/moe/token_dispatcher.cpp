// Tokens to the experts and back: gate, dispatch by index, all-to-all, combine by index (token_dispatcher.h).
#include "dscpp/moe/token_dispatcher.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

#include "dscpp/parallel/collective_op.h"

namespace dscpp::moe {

void check_expert_counts(int64_t num_experts, int ep_size, int k) {
  if (ep_size < 1 || num_experts < 1 || num_experts % ep_size != 0) {
    throw std::invalid_argument("MoE num_experts " + std::to_string(num_experts) + " is not divisible by ep_size " +
                                std::to_string(ep_size));
  }
  if (num_experts < k) {
    throw std::invalid_argument("MoE num_experts " + std::to_string(num_experts) + " is fewer than k " +
                                std::to_string(k));
  }
}

TokenDispatcher::TokenDispatcher(int64_t num_experts, const GateOptions& gate, std::shared_ptr<Comm> ep_group)
    : num_experts_(num_experts), gate_(gate), ep_group_(std::move(ep_group)) {
  gate_.validate();
  if (!ep_group_) ep_group_ = make_single_process_comm();
  check_expert_counts(num_experts_, ep_group_->world_size(), gate_.k);
}

// Rows (rank-major chunks) exchanged over the expert-parallel group; the gradient takes the way back (the exchange
// is its own transpose). Each exchange's time, forward and backward, is added to all_to_all_ns_.
torch::Tensor TokenDispatcher::exchange(const torch::Tensor& rows) {
  const TensorMap all_to_all = [group = ep_group_, waited_ns = all_to_all_ns_](const torch::Tensor& t) {
    const auto start = std::chrono::steady_clock::now();
    auto in = t.contiguous();
    auto out = torch::empty_like(in);
    group->all_to_all(out, in).wait();
    *waited_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    return out;
  };
  return collective_op(rows, ep_group_, "dscpp::MoEAllToAllBackward", all_to_all, all_to_all);
}

DispatchedTokens TokenDispatcher::dispatch(const torch::Tensor& tokens, const torch::Tensor& gate_weight,
                                           bool training) {
  if (tokens.dim() != 2 || gate_weight.dim() != 2 || gate_weight.size(0) != num_experts_ ||
      gate_weight.size(1) != tokens.size(1)) {
    throw std::invalid_argument("MoE dispatch: tokens must be (S, M) and the gate weight (num_experts " +
                                std::to_string(num_experts_) + ", M); got " + c10::str(tokens.sizes()) + " and " +
                                c10::str(gate_weight.sizes()));
  }
  const int64_t S = tokens.size(0), M = tokens.size(1);
  auto gate_input = tokens.to(torch::kFloat);
  if (training && gate_.noisy_gate_policy == NoisyGatePolicy::kJitter) {
    gate_input = gate_input * torch::empty_like(gate_input).uniform_(1.0 - 1e-2, 1.0 + 1e-2);
  }
  const auto routing = route(torch::linear(gate_input, gate_weight.to(torch::kFloat)), gate_, training, ep_group_.get());
  const int64_t E = num_experts_, C = routing.capacity;

  // Every choice of every token: its token, its row, its weight. A dropped choice goes to the spare row past the
  // experts' E·C with weight 0, so the choices need no selecting: nonzero() would stop a GPU stream until its count
  // is known.
  const int64_t k = routing.kept.size(0), spare = E * C;
  DispatchedTokens out;
  out.tokens = S;
  out.l_aux = routing.l_aux;
  out.exp_counts = routing.exp_counts;
  out.source = torch::arange(S, routing.expert.options()).repeat({k});
  out.row = torch::where(routing.kept, routing.expert * C + routing.location, torch::full_like(routing.location, spare))
                .reshape({-1});
  out.weight = routing.weight.reshape({-1}).to(tokens.scalar_type());

  auto buffer = torch::zeros({spare + 1, M}, tokens.options()).index_copy(0, out.row, tokens.index_select(0, out.source));
  // (E·C, M) = P chunks of (L, C, M), chunk j for expert-parallel rank j; received likewise, chunk j from rank j.
  out.expert_inputs = exchange(buffer.narrow(0, 0, spare)).view({ep_size(), num_local_experts(), C, M});
  return out;
}

torch::Tensor TokenDispatcher::combine(const torch::Tensor& expert_outputs, const DispatchedTokens& dispatched) {
  const auto& in = dispatched.expert_inputs;
  if (expert_outputs.dim() != 4 || expert_outputs.size(0) != in.size(0) || expert_outputs.size(1) != in.size(1) ||
      expert_outputs.size(2) != in.size(2)) {
    throw std::invalid_argument("MoE combine: the experts' outputs must be laid out as their inputs " +
                                c10::str(in.sizes()) + " (ep_size, local experts, capacity, width); got " +
                                c10::str(expert_outputs.sizes()));
  }
  const int64_t width = expert_outputs.size(3), rows = in.size(0) * in.size(1) * in.size(2);
  auto returned = exchange(expert_outputs.reshape({rows, width}));
  // The spare row back as zeros: a dropped choice adds 0 · 0.
  returned = torch::cat({returned, torch::zeros({1, width}, returned.options())});
  return torch::zeros({dispatched.tokens, width}, returned.options())
      .index_add(0, dispatched.source, returned.index_select(0, dispatched.row) * dispatched.weight.unsqueeze(1));
}

}  // namespace dscpp::moe
