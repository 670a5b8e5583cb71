// The gate's routing: masks over (tokens, experts), slots from running counts, as sharded_moe.py computes them, kept
// sparse — (choice, token) → expert, slot, weight — so the layer moves tokens by index instead of through an
// (S, E, C) einsum.
#include "dscpp/moe/gate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace dscpp::moe {
namespace {

std::string number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// Gumbel(0, 1) noise: -log(-log(u)), u uniform in (0, 1) kept off both ends as torch.distributions.Gumbel does.
torch::Tensor gumbel_like(const torch::Tensor& t) {
  const auto u = torch::rand_like(t).clamp(std::numeric_limits<float>::min(), 1.0 - std::numeric_limits<float>::epsilon());
  return -torch::log(-torch::log(u));
}

// The largest number of tokens any expert was sent, over the expert-parallel group.
int64_t largest_count(const torch::Tensor& exp_counts, Comm* ep_group) {
  auto most = exp_counts.max().reshape({1}).clone();
  if (ep_group && ep_group->world_size() > 1) ep_group->all_reduce(most, ReduceOp::kMax).wait();
  return most.item<int64_t>();
}

// A one-hot mask's running position of each token at its expert: the slot it takes if all before it are kept.
torch::Tensor slots(const torch::Tensor& mask) { return torch::cumsum(mask, 0) - 1; }

Routing top1(const torch::Tensor& logits, const torch::Tensor& gates, const GateOptions& o, bool training,
             Comm* ep_group) {
  const int64_t S = logits.size(0), E = logits.size(1);
  if (S < o.min_capacity) {
    throw std::invalid_argument("MoE top-1 gate: " + std::to_string(S) + " tokens, fewer than min_capacity " +
                                std::to_string(o.min_capacity) + "; lower min_capacity or raise the micro-batch");
  }
  torch::Tensor choice;
  {
    torch::NoGradGuard no_grad;
    const bool rsample = training && o.noisy_gate_policy == NoisyGatePolicy::kRSample;
    choice = torch::argmax(rsample ? logits + gumbel_like(logits) : gates, 1);
  }
  auto mask = torch::one_hot(choice, E);  // (S, E) int64
  Routing r;
  r.num_experts = E;
  r.exp_counts = mask.sum(0);
  r.l_aux = (gates.mean(0) * mask.to(torch::kFloat).mean(0)).sum() * static_cast<double>(E);
  const double factor = training ? o.capacity_factor : o.eval_capacity_factor;
  r.capacity = o.drop_tokens ? expert_capacity(S, E, factor, o.min_capacity)
                             : std::min(largest_count(r.exp_counts, ep_group), S);
  // An expert over capacity keeps the tokens torch.topk picks down its column: with Random Token Selection those of
  // the largest uniform draws, without it those topk picks among the equal 1s of the mask — DeepSpeed's top1gating
  // does exactly this (same op, dtype and draw from the default generator), so both keep the same tokens. (Not the
  // first ones in token order, as top-2 keeps.)
  const auto priority = o.use_rts ? mask.to(torch::kFloat) * torch::rand({S, E}, logits.options()) : mask;
  const auto chosen = std::get<1>(torch::topk(priority, std::min(r.capacity, S), 0));
  mask = mask * torch::zeros_like(mask).scatter_(0, chosen, 1);
  const auto kept = mask.sum(1).gt(0);
  r.expert = choice.unsqueeze(0);
  r.location = (slots(mask) * mask).sum(1).unsqueeze(0);
  r.kept = kept.unsqueeze(0);
  r.weight = (gates * mask.to(torch::kFloat)).sum(1).unsqueeze(0);
  return r;
}

Routing top2(const torch::Tensor& logits, const torch::Tensor& gates, const GateOptions& o, bool training,
             Comm* ep_group) {
  const int64_t S = logits.size(0), E = logits.size(1);
  torch::Tensor first, second;
  {
    torch::NoGradGuard no_grad;
    first = torch::argmax(gates, 1);
    // The second choice is sampled (Gumbel-max) when asked: the best of the rest of the noisy logits.
    const auto noisy = o.top2_2nd_expert_sampling ? logits + gumbel_like(logits) : logits;
    second = torch::argmax(noisy.masked_fill(torch::one_hot(first, E).to(torch::kBool),
                                             -std::numeric_limits<float>::infinity()),
                           1);
  }
  auto mask1 = torch::one_hot(first, E), mask2 = torch::one_hot(second, E);
  const auto slots1 = slots(mask1);
  const auto slots2 = slots(mask2) + mask1.sum(0, /*keepdim=*/true);  // every first choice is placed before
  Routing r;
  r.num_experts = E;
  r.exp_counts = (mask1 + mask2).sum(0);
  r.l_aux = (gates.mean(0) * mask1.to(torch::kFloat).mean(0)).mean() * static_cast<double>(E * E);
  const double factor = training ? o.capacity_factor : o.eval_capacity_factor;
  if (o.drop_tokens) {
    r.capacity = expert_capacity(S, E, 2 * factor, o.min_capacity);
    mask1 = mask1 * slots1.lt(r.capacity);
    mask2 = mask2 * slots2.lt(r.capacity);
  } else {
    r.capacity = largest_count(r.exp_counts, ep_group);
  }
  auto g1 = (gates * mask1.to(torch::kFloat)).sum(1);
  auto g2 = (gates * mask2.to(torch::kFloat)).sum(1);
  const auto denom = (g1 + g2).clamp_min(std::numeric_limits<float>::epsilon());
  r.expert = torch::stack({first, second});
  r.location = torch::stack({(slots1 * mask1).sum(1), (slots2 * mask2).sum(1)});
  r.kept = torch::stack({mask1.sum(1).gt(0), mask2.sum(1).gt(0)});
  r.weight = torch::stack({g1 / denom, g2 / denom});
  return r;
}

}  // namespace

NoisyGatePolicy parse_noisy_gate_policy(const std::string& name) {
  if (name == "None") return NoisyGatePolicy::kNone;
  if (name == "Jitter") return NoisyGatePolicy::kJitter;
  if (name == "RSample") return NoisyGatePolicy::kRSample;
  throw std::invalid_argument("noisy_gate_policy \"" + name + "\" is not one of None, Jitter, RSample");
}

const char* to_string(NoisyGatePolicy policy) {
  switch (policy) {
    case NoisyGatePolicy::kJitter: return "Jitter";
    case NoisyGatePolicy::kRSample: return "RSample";
    case NoisyGatePolicy::kNone: break;
  }
  return "None";
}

void GateOptions::validate() const {
  if (k != 1 && k != 2) throw std::invalid_argument("MoE k is " + std::to_string(k) + "; it must be 1 or 2");
  if (!(capacity_factor > 0))
    throw std::invalid_argument("MoE capacity_factor is " + number(capacity_factor) + "; it must be > 0");
  if (!(eval_capacity_factor > 0))
    throw std::invalid_argument("MoE eval_capacity_factor is " + number(eval_capacity_factor) + "; it must be > 0");
  if (min_capacity < 0)
    throw std::invalid_argument("MoE min_capacity is " + std::to_string(min_capacity) + "; it must be >= 0");
}

int64_t expert_capacity(int64_t tokens, int64_t experts, double factor, int64_t min_capacity) {
  // In fp32, as DeepSpeed's (tokens / experts) * torch.tensor(factor) is.
  const float fraction = static_cast<float>(static_cast<double>(tokens) / static_cast<double>(experts));
  const auto capacity = static_cast<int64_t>(std::ceil(fraction * static_cast<float>(factor)));
  return std::max(capacity, min_capacity);
}

torch::Tensor Routing::combine_weights() const {
  const int64_t S = weight.size(1);
  auto out = torch::zeros({S, num_experts, capacity}, weight.options());
  const auto tokens = torch::arange(S, expert.options());
  for (int64_t c = 0; c < weight.size(0); ++c) {
    out.index_put_({tokens, expert[c], location[c]}, weight[c] * kept[c].to(weight.scalar_type()),
                   /*accumulate=*/true);
  }
  return out;
}

torch::Tensor Routing::dispatch_mask() const { return combine_weights().ne(0); }

Routing route(const torch::Tensor& logits, const GateOptions& options, bool training, Comm* ep_group) {
  options.validate();
  if (logits.dim() != 2 || logits.size(1) < options.k) {
    throw std::invalid_argument("MoE gate: logits must be (tokens, experts) with at least k = " +
                                std::to_string(options.k) + " experts, got shape " + torch::str(logits.sizes()));
  }
  const auto fp32 = logits.to(torch::kFloat);  // the gate computes in fp32, whatever the model's dtype
  const auto gates = torch::softmax(fp32, 1);
  return options.k == 1 ? top1(fp32, gates, options, training, ep_group)
                        : top2(fp32, gates, options, training, ep_group);
}

}  // namespace dscpp::moe
