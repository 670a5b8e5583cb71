// The gate's routing against a straightforward reference written here token by token (fp32, no RTS, no noise):
// capacities, which tokens are dropped, slots, combine weights, aux loss and counts, for k = 1 and 2 with
// drop_tokens on and off; and the options' errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dscpp/moe/gate.h"

namespace dscpp::moe {
namespace {

struct Reference {
  int64_t capacity = 0;
  torch::Tensor combine;     // (S, E, C)
  torch::Tensor exp_counts;  // (E)
  double l_aux = 0;
};

// Token by token, in order: each choice takes the next free slot of its expert (second choices after every first
// choice), and a choice past the capacity is dropped. Top-1 keeps, of an overflowing expert's tokens, those
// torch.topk picks over its column of the 0/1 mask (DeepSpeed's rule), then gives them slots in token order.
Reference reference(const torch::Tensor& logits, int k, double factor, int64_t min_capacity, bool drop_tokens) {
  const auto gates = torch::softmax(logits, 1);
  const int64_t S = logits.size(0), E = logits.size(1);
  auto g = gates.accessor<float, 2>();
  auto l = logits.accessor<float, 2>();
  std::vector<int64_t> first(S), second(S, -1);
  std::vector<int64_t> first_count(E, 0), second_count(E, 0);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t e = 0; e < E; ++e) {
      if (g[s][e] > g[s][first[s]]) first[s] = e;
    }
    ++first_count[first[s]];
    if (k == 2) {
      for (int64_t e = 0; e < E; ++e) {
        if (e != first[s] && (second[s] < 0 || l[s][e] > l[s][second[s]])) second[s] = e;
      }
      ++second_count[second[s]];
    }
  }
  Reference r;
  r.exp_counts = torch::zeros({E}, torch::kLong);
  int64_t most = 0;
  for (int64_t e = 0; e < E; ++e) {
    r.exp_counts[e] = first_count[e] + second_count[e];
    most = std::max(most, first_count[e] + second_count[e]);
  }
  if (drop_tokens) {
    r.capacity = std::max<int64_t>(static_cast<int64_t>(std::ceil(static_cast<double>(S) / E * factor * k)), min_capacity);
  } else {
    r.capacity = most;
  }
  r.combine = torch::zeros({S, E, r.capacity});
  std::vector<bool> keep1(S, true);
  if (k == 1 && drop_tokens) {
    const auto mask = torch::one_hot(torch::tensor(first, torch::kLong), E);
    const auto picked = std::get<1>(torch::topk(mask, std::min(r.capacity, S), 0));  // (capacity, E) token indices
    std::fill(keep1.begin(), keep1.end(), false);
    for (int64_t c = 0; c < picked.size(0); ++c) {
      for (int64_t e = 0; e < E; ++e) {
        const int64_t s = picked[c][e].item<int64_t>();
        if (first[s] == e) keep1[s] = true;
      }
    }
  }
  std::vector<int64_t> next(E, 0), slot1(S, -1), slot2(S, -1);
  for (int64_t s = 0; s < S; ++s) {
    if (keep1[s] && next[first[s]] < r.capacity) slot1[s] = next[first[s]]++;
  }
  if (k == 2) {
    for (int64_t e = 0; e < E; ++e) next[e] = first_count[e];  // second choices start after every first choice
    for (int64_t s = 0; s < S; ++s) {
      const int64_t slot = next[second[s]]++;
      if (slot < r.capacity) slot2[s] = slot;
    }
  }
  for (int64_t s = 0; s < S; ++s) {
    const double w1 = slot1[s] >= 0 ? g[s][first[s]] : 0.0;
    const double w2 = k == 2 && slot2[s] >= 0 ? g[s][second[s]] : 0.0;
    const double denom = k == 2 ? std::max<double>(w1 + w2, std::numeric_limits<float>::epsilon()) : 1.0;
    if (slot1[s] >= 0) r.combine[s][first[s]][slot1[s]] = w1 / denom;
    if (slot2[s] >= 0) r.combine[s][second[s]][slot2[s]] = w2 / denom;
  }
  double l_aux = 0;
  for (int64_t e = 0; e < E; ++e) {
    double mean_gate = 0;
    for (int64_t s = 0; s < S; ++s) mean_gate += g[s][e];
    l_aux += mean_gate / S * (static_cast<double>(first_count[e]) / S);
  }
  r.l_aux = l_aux * E;
  return r;
}

// Logits that crowd expert 0, so its capacity overflows.
torch::Tensor skewed_logits(int64_t tokens, int64_t experts, uint64_t seed) {
  torch::manual_seed(seed);
  auto logits = torch::randn({tokens, experts});
  logits.select(1, 0).add_(1.5);
  return logits;
}

GateOptions deterministic(int k, bool drop_tokens) {
  GateOptions o;
  o.k = k;
  o.drop_tokens = drop_tokens;
  o.use_rts = false;
  o.top2_2nd_expert_sampling = false;
  o.min_capacity = 0;
  return o;
}

void expect_matches(const Routing& routing, const Reference& ref) {
  ASSERT_EQ(routing.capacity, ref.capacity);
  EXPECT_TRUE(torch::allclose(routing.combine_weights(), ref.combine, 1e-6, 1e-7))
      << (routing.combine_weights() - ref.combine).abs().max();
  EXPECT_TRUE(torch::equal(routing.dispatch_mask(), ref.combine.ne(0)));
  EXPECT_TRUE(torch::equal(routing.exp_counts, ref.exp_counts)) << routing.exp_counts << ref.exp_counts;
  EXPECT_NEAR(routing.l_aux.item<double>(), ref.l_aux, 1e-6);
}

class GateRouting : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(GateRouting, MatchesTheTokenByTokenReference) {
  const auto [k, drop] = GetParam();
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const auto logits = skewed_logits(32, 4, seed);
    const auto routing = route(logits, deterministic(k, drop), /*training=*/true);
    const auto ref = reference(logits, k, 1.0, 0, drop);
    expect_matches(routing, ref);
    if (drop) {
      // The skew must make the test drop something, or it would not test the order of dropping.
      EXPECT_LT(routing.kept.sum().item<int64_t>(), 32 * k);
    } else {
      EXPECT_EQ(routing.kept.sum().item<int64_t>(), 32 * k);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TopKAndDropping, GateRouting,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(true, false)),
                         [](const auto& info) {
                           return "k" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_drop" : "_nodrop");
                         });

TEST(Gate, CapacityIsTheFactorsShareOrMinCapacity) {
  EXPECT_EQ(expert_capacity(32, 4, 1.0, 0), 8);
  EXPECT_EQ(expert_capacity(32, 4, 1.25, 0), 10);
  EXPECT_EQ(expert_capacity(30, 4, 1.0, 0), 8);  // ceil(7.5)
  EXPECT_EQ(expert_capacity(8, 4, 1.0, 4), 4);   // min_capacity wins
  // The gate uses the eval factor outside training, and top-2 doubles the factor.
  auto o = deterministic(1, true);
  o.capacity_factor = 2.0;
  o.eval_capacity_factor = 0.5;
  const auto logits = skewed_logits(32, 4, 7);
  EXPECT_EQ(route(logits, o, true).capacity, 16);
  EXPECT_EQ(route(logits, o, false).capacity, 4);
  o.k = 2;
  EXPECT_EQ(route(logits, o, true).capacity, 32);
  EXPECT_EQ(route(logits, o, false).capacity, 8);
}

// Random Token Selection keeps `capacity` of an overflowing expert's tokens, not the first ones, and only tokens
// sent to it.
TEST(Gate, RandomTokenSelectionKeepsCapacityOfTheTokensSentThere) {
  auto o = deterministic(1, true);
  o.use_rts = true;
  const auto logits = skewed_logits(64, 4, 5);
  torch::manual_seed(11);
  const auto rts = route(logits, o, true);
  o.use_rts = false;
  const auto ordered = route(logits, o, true);
  EXPECT_TRUE(torch::equal(rts.expert, ordered.expert));
  const auto to0 = rts.expert[0].eq(0);
  ASSERT_GT(to0.sum().item<int64_t>(), rts.capacity);
  EXPECT_EQ((rts.kept[0] & to0).sum().item<int64_t>(), rts.capacity);
  EXPECT_FALSE(torch::equal(rts.kept, ordered.kept)) << "RTS kept the tokens topk over the 0/1 mask keeps";
  // Slots of the kept tokens are 0..capacity-1, once each.
  const auto slots = std::get<0>(torch::sort(rts.location[0].masked_select(rts.kept[0] & to0)));
  EXPECT_TRUE(torch::equal(slots, torch::arange(rts.capacity)));
}

TEST(Gate, BadOptionsAreNamedWithTheirValues) {
  auto expect_error = [](GateOptions o, const std::string& message) {
    try {
      o.validate();
      ADD_FAILURE() << "accepted: " << message;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  GateOptions o;
  o.k = 3;
  expect_error(o, "MoE k is 3; it must be 1 or 2");
  o = GateOptions{};
  o.capacity_factor = 0;
  expect_error(o, "MoE capacity_factor is 0; it must be > 0");
  o = GateOptions{};
  o.eval_capacity_factor = -0.5;
  expect_error(o, "MoE eval_capacity_factor is -0.5; it must be > 0");
  try {
    parse_noisy_gate_policy("Gaussian");
    ADD_FAILURE() << "Gaussian accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "noisy_gate_policy \"Gaussian\" is not one of None, Jitter, RSample");
  }
  EXPECT_EQ(parse_noisy_gate_policy("RSample"), NoisyGatePolicy::kRSample);
  // Top-1 with fewer tokens than min_capacity, as DeepSpeed asserts.
  GateOptions top1;
  top1.min_capacity = 8;
  try {
    route(torch::randn({6, 4}), top1, true);
    ADD_FAILURE() << "6 tokens with min_capacity 8 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("6 tokens, fewer than min_capacity 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dscpp::moe
