// The MoE layer: gate, dispatch by index, all-to-all over the expert-parallel group, local experts, all-to-all back,
// combine by index.
#include "dscpp/moe/moe_layer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "dscpp/parallel/collective_op.h"

namespace dscpp::moe {
namespace {

// Rows of `x` (rank-major chunks) exchanged over `group`; its gradient takes the way back (the exchange is its own
// transpose). The time each exchange takes, forward and backward, is added to `waited_ns`.
torch::Tensor exchange_tokens(const torch::Tensor& x, const std::shared_ptr<Comm>& group,
                              const std::shared_ptr<std::atomic<int64_t>>& waited_ns) {
  const TensorMap all_to_all = [group, waited_ns](const torch::Tensor& t) {
    const auto start = std::chrono::steady_clock::now();
    auto in = t.contiguous();
    auto out = torch::empty_like(in);
    group->all_to_all(out, in).wait();
    *waited_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    return out;
  };
  return collective_op(x, group, "dscpp::MoEAllToAllBackward", all_to_all, all_to_all);
}

// A holder module, so that parameter names nest as DeepSpeed's (LibTorch names may not contain dots).
std::shared_ptr<torch::nn::Module> holder(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}

}  // namespace

MoEImpl::MoEImpl(const MoEOptions& options, torch::nn::AnyModule expert, std::shared_ptr<Comm> ep_group)
    : options_(options), ep_group_(std::move(ep_group)) {
  options_.gate.validate();
  const auto& o = options_;
  if (o.hidden_size < 1) throw std::invalid_argument("MoE hidden_size is " + std::to_string(o.hidden_size) + "; it must be >= 1");
  if (o.ep_size < 1 || o.num_experts < 1 || o.num_experts % o.ep_size != 0) {
    throw std::invalid_argument("MoE num_experts " + std::to_string(o.num_experts) +
                                " is not divisible by ep_size " + std::to_string(o.ep_size));
  }
  if (o.num_experts < o.gate.k) {
    throw std::invalid_argument("MoE num_experts " + std::to_string(o.num_experts) + " is fewer than k " +
                                std::to_string(o.gate.k));
  }
  if (!ep_group_) ep_group_ = make_single_process_comm();
  if (ep_group_->world_size() != o.ep_size) {
    throw std::invalid_argument("MoE ep_size is " + std::to_string(o.ep_size) + " but the expert-parallel group has " +
                                std::to_string(ep_group_->world_size()) + " ranks");
  }
  if (expert.is_empty()) throw std::invalid_argument("MoE: no expert module given");
  first_expert_ = ep_group_->rank() * num_local_experts();

  auto layer = holder(*this, "deepspeed_moe");
  auto gate = holder(*layer, "gate");
  wg = gate->register_module("wg", torch::nn::Linear(torch::nn::LinearOptions(o.hidden_size, o.num_experts).bias(false)));
  auto local = holder(*holder(*layer, "experts"), "deepspeed_experts");
  // Cloneable::clone builds each copy afresh (drawing initial values from the default generator) before copying the
  // values over; Python's deepcopy draws nothing. Restoring the generator keeps every later draw of the model's
  // construction independent of how many experts this rank holds, so a model is the same at every ep_size.
  auto generator = at::detail::getDefaultCPUGenerator();
  const auto generator_state = generator.get_state();
  for (int64_t i = 0; i < num_local_experts(); ++i) {
    torch::nn::AnyModule copy;
    try {
      copy = expert.clone();  // DeepSpeed deep-copies the expert for every local expert
    } catch (const c10::Error& e) {
      throw std::invalid_argument(std::string("MoE: the expert module cannot be deep-copied for each expert; make it "
                                              "a torch::nn::Cloneable (") + e.what_without_backtrace() + ")");
    }
    const auto name = std::to_string(first_expert_ + i);
    local->register_module(name, copy.ptr());
    expert_prefixes_.push_back("deepspeed_moe.experts.deepspeed_experts." + name + ".");
    experts.push_back(std::move(copy));
  }
  generator.set_state(generator_state);
  if (o.use_residual) {
    mlp = std::move(expert);
    register_module("mlp", mlp.ptr());
    coefficient = register_module("coefficient", torch::nn::Linear(o.hidden_size, 2));
  }
}

MoEOutput MoEImpl::forward(const torch::Tensor& hidden_states) {
  const int64_t M = options_.hidden_size;
  if (hidden_states.size(-1) != M) {
    throw std::invalid_argument("MoE: input's last dimension is " + std::to_string(hidden_states.size(-1)) +
                                ", the layer's hidden_size " + std::to_string(M));
  }
  const auto tokens = hidden_states.reshape({-1, M});  // (S, M)
  const int64_t S = tokens.size(0);

  auto gate_input = tokens.to(torch::kFloat);
  if (is_training() && options_.gate.noisy_gate_policy == NoisyGatePolicy::kJitter) {
    gate_input = gate_input * torch::empty_like(gate_input).uniform_(1.0 - 1e-2, 1.0 + 1e-2);
  }
  const auto routing = route(torch::linear(gate_input, wg->weight.to(torch::kFloat)), options_.gate, is_training(),
                             ep_group_.get());
  const int64_t E = options_.num_experts, C = routing.capacity;

  // Every choice of every token: its token, the row it takes in the dispatch buffer, and its weight. A dropped choice
  // goes to one spare row past the experts' E·C (which no expert reads) with weight 0, so the choices need no
  // selecting: nonzero() would stop a GPU stream until its count is known.
  const int64_t k = routing.kept.size(0), spare = E * C;
  const auto source = torch::arange(S, routing.expert.options()).repeat({k});
  const auto row =
      torch::where(routing.kept, routing.expert * C + routing.location, torch::full_like(routing.location, spare))
          .reshape({-1});
  const auto weight = routing.weight.reshape({-1}).to(tokens.scalar_type());

  auto dispatched = torch::zeros({spare + 1, M}, tokens.options()).index_copy(0, row, tokens.index_select(0, source));
  // (E·C, M) = ep_size chunks of (local experts, C, M), chunk j for expert-parallel rank j.
  const int64_t P = options_.ep_size, L = num_local_experts();
  auto received = exchange_tokens(dispatched.narrow(0, 0, spare), ep_group_, all_to_all_ns_).view({P, L, C, M});
  std::vector<torch::Tensor> outputs;
  outputs.reserve(L);
  for (int64_t i = 0; i < L; ++i) outputs.push_back(experts[i].forward<torch::Tensor>(received.select(1, i)));
  auto expert_output = exchange_tokens(torch::stack(outputs, 1).reshape({spare, M}), ep_group_, all_to_all_ns_);
  // The spare row back as zeros: a dropped choice adds 0 · 0.
  expert_output = torch::cat({expert_output, torch::zeros({1, M}, expert_output.options())});

  auto combined = torch::zeros({S, M}, tokens.options())
                      .index_add(0, source, expert_output.index_select(0, row) * weight.unsqueeze(1));
  auto output = combined.view(hidden_states.sizes());
  if (options_.use_residual) {
    const auto dense = mlp.forward<torch::Tensor>(hidden_states);
    const auto coef = torch::softmax(coefficient->forward(hidden_states), -1);
    output = output * coef.narrow(-1, 0, 1) + dense * coef.narrow(-1, 1, 1);
  }
  return {output, routing.l_aux, routing.exp_counts};
}

std::vector<std::pair<std::string, torch::Tensor>> MoEImpl::expert_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t i = 0; i < experts.size(); ++i) {
    for (const auto& p : experts[i].ptr()->named_parameters()) out.emplace_back(expert_prefixes_[i] + p.key(), p.value());
  }
  return out;
}

std::vector<std::string> expert_parameter_names(const torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_modules()) {
    const auto* layer = dynamic_cast<const MoEImpl*>(item.value().get());
    if (!layer) continue;
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    for (const auto& [name, param] : layer->expert_parameters()) {
      if (param.requires_grad()) names.push_back(prefix + name);
    }
  }
  return names;
}

int expert_parallel_size(const torch::nn::Module& model) {
  int ep = 1;
  for (const auto& item : model.named_modules()) {
    if (const auto* layer = dynamic_cast<const MoEImpl*>(item.value().get())) ep = std::max(ep, layer->options().ep_size);
  }
  return ep;
}

}  // namespace dscpp::moe
