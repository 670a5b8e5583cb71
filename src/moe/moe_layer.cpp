// The MoE layer: its parameters (gate, local experts, residual MLP) around a TokenDispatcher, which moves the tokens.
#include "dscpp/moe/moe_layer.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace dscpp::moe {
namespace {

// A holder module, so that parameter names nest as DeepSpeed's (LibTorch names may not contain dots).
std::shared_ptr<torch::nn::Module> holder(torch::nn::Module& parent, const std::string& name) {
  return parent.register_module(name, std::make_shared<torch::nn::Module>());
}

}  // namespace

MoEImpl::MoEImpl(const MoEOptions& options, torch::nn::AnyModule expert, std::shared_ptr<Comm> ep_group)
    : options_(options) {
  const auto& o = options_;
  if (o.hidden_size < 1) throw std::invalid_argument("MoE hidden_size is " + std::to_string(o.hidden_size) + "; it must be >= 1");
  check_expert_counts(o.num_experts, o.ep_size, o.gate.k);
  const int group_size = ep_group ? ep_group->world_size() : 1;
  if (group_size != o.ep_size) {
    throw std::invalid_argument("MoE ep_size is " + std::to_string(o.ep_size) + " but the expert-parallel group has " +
                                std::to_string(group_size) + " ranks");
  }
  dispatcher_ = std::make_shared<TokenDispatcher>(o.num_experts, o.gate, std::move(ep_group));
  if (expert.is_empty()) throw std::invalid_argument("MoE: no expert module given");

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
    const auto name = std::to_string(first_local_expert() + i);
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
  const auto dispatched = dispatcher_->dispatch(hidden_states.reshape({-1, M}), wg->weight, is_training());
  std::vector<torch::Tensor> outputs;
  outputs.reserve(experts.size());
  for (size_t i = 0; i < experts.size(); ++i) {
    outputs.push_back(experts[i].forward<torch::Tensor>(dispatched.expert_inputs.select(1, static_cast<int64_t>(i))));
  }
  auto output = dispatcher_->combine(torch::stack(outputs, 1), dispatched).view(hidden_states.sizes());
  if (options_.use_residual) {
    const auto dense = mlp.forward<torch::Tensor>(hidden_states);
    const auto coef = torch::softmax(coefficient->forward(hidden_states), -1);
    output = output * coef.narrow(-1, 0, 1) + dense * coef.narrow(-1, 1, 1);
  }
  return {output, dispatched.l_aux, dispatched.exp_counts};
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
