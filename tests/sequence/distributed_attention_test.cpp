// DistributedAttention against attention over the whole sequence. Every rank builds the same whole query, key and
// value (one seed); each sequence-parallel rank takes its slice of the sequence, attends through the all-to-alls,
// and must get its slice of the whole output, and — from its slice of one upstream gradient — its slice of the whole
// query's, key's and value's gradients. Over 2 ranks (one group), 4 ranks (one group of 4) and 4 ranks as two groups
// of 2, in both layouts (batch first and sequence first); the errors name their numbers.
#include <gtest/gtest.h>

#include <iostream>

#include "../common/multiprocess.h"
#include "dscpp/dscpp.h"
#include "dscpp/sequence/distributed_attention.h"

namespace dscpp::testing {
namespace {

constexpr int64_t kBatch = 2, kSeq = 8, kHeads = 4, kHeadDim = 3;

// Causal attention over whole sequences, heads at dimension 2: [B, S, h, D] (batch_dim 0) or [S, B, h, D].
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               int64_t batch_dim) {
  // To [B, h, S, D] for scaled_dot_product_attention, and back.
  auto heads_first = [&](const torch::Tensor& t) {
    return batch_dim == 0 ? t.permute({0, 2, 1, 3}) : t.permute({1, 2, 0, 3});
  };
  auto out = at::scaled_dot_product_attention(heads_first(q), heads_first(k), heads_first(v), {}, 0.0,
                                              /*is_causal=*/true);
  return batch_dim == 0 ? out.permute({0, 2, 1, 3}) : out.permute({2, 0, 1, 3});
}

bool close(const torch::Tensor& got, const torch::Tensor& want) {
  return got.sizes() == want.sizes() && torch::allclose(got, want, /*rtol=*/1e-5, /*atol=*/1e-6);
}

void check(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what + " differs from the whole sequence's");
}

// One comparison over `group` in `batch_dim`'s layout.
void compare(const std::shared_ptr<Comm>& group, int64_t batch_dim) {
  const int64_t seq_dim = batch_dim == 0 ? 1 : 0;
  auto shape = batch_dim == 0 ? std::vector<int64_t>{kBatch, kSeq, kHeads, kHeadDim}
                              : std::vector<int64_t>{kSeq, kBatch, kHeads, kHeadDim};
  torch::manual_seed(11);
  auto q = torch::randn(shape, torch::requires_grad()), k = torch::randn(shape, torch::requires_grad()),
       v = torch::randn(shape, torch::requires_grad());
  auto upstream = torch::randn(shape);
  auto whole = causal_attention(q, k, v, batch_dim);
  (whole * upstream).sum().backward();

  const int p = group->world_size(), r = group->rank();
  auto mine = [&](const torch::Tensor& t) { return t.chunk(p, seq_dim)[r]; };
  auto leaf = [&](const torch::Tensor& t) { return mine(t).detach().clone().requires_grad_(true); };
  auto qs = leaf(q), ks = leaf(k), vs = leaf(v);
  DistributedAttention attention(
      [batch_dim](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
        return causal_attention(a, b, c, batch_dim);
      },
      group);
  auto out = attention.forward(qs, ks, vs, batch_dim);
  check(close(out, mine(whole)), "the output");
  (out * mine(upstream)).sum().backward();
  check(close(qs.grad(), mine(q.grad())), "the query's gradient");
  check(close(ks.grad(), mine(k.grad())), "the key's gradient");
  check(close(vs.grad(), mine(v.grad())), "the value's gradient");
}

// The exchange's layout, exactly: rank r of P gets heads [r·h/P, (r+1)·h/P) of the whole sequence, its pieces in
// rank order; the reverse exchange gives back the input bit for bit.
void check_layout(const std::shared_ptr<Comm>& group) {
  const int p = group->world_size(), r = group->rank();
  auto whole = torch::arange(kBatch * kSeq * kHeads * kHeadDim, torch::kFloat).view({kBatch, kSeq, kHeads, kHeadDim});
  auto slice = whole.chunk(p, 1)[r].contiguous();
  auto exchanged = seq_all_to_all(slice, group, 2, 1);
  check(torch::equal(exchanged, whole.chunk(p, 2)[r]), "the exchanged layout");
  check(torch::equal(seq_all_to_all(exchanged, group, 1, 2), slice), "the reverse exchange");
}

void expect_error(const std::function<void()>& fn, const std::string& message) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find(message) != std::string::npos) return;
    throw std::runtime_error("the error '" + std::string(e.what()) + "' does not say '" + message + "'");
  }
  throw std::runtime_error("no error for: " + message);
}

int worker(const std::string& scenario) {
  auto world = init_comm(DistEnv::from_env(), CommBackend::kGloo);
  // "pairs": consecutive pairs of ranks are the sequence-parallel groups; otherwise one group of every rank.
  const int size = scenario == "pairs" ? 2 : world->world_size();
  auto group = world->split(world->rank() / size, world->rank());
  check_layout(group);
  for (int64_t batch_dim : {0, 1}) compare(group, batch_dim);
  auto three_heads = torch::zeros({kBatch, kSeq / size, 3, kHeadDim});
  DistributedAttention attention([](const torch::Tensor& q, const torch::Tensor&, const torch::Tensor&) { return q; },
                                 group);
  expect_error([&] { attention.forward(three_heads, three_heads, three_heads); },
               "3 heads do not divide by the sequence-parallel size " + std::to_string(size));
  world->barrier();
  std::cout << "rank " << world->rank() << " ok" << std::endl;
  return 0;
}

TEST(DistributedAttention, OneRankIsTheLocalAttention) {
  auto alone = make_single_process_comm();
  check_layout(alone);
  for (int64_t batch_dim : {0, 1}) compare(alone, batch_dim);
}

TEST(DistributedAttention, OverRealProcessesGivesTheWholeSequencesOutputAndGradients) {
  const std::string self = "/proc/" + std::to_string(::getpid()) + "/exe";
  for (const auto& [scenario, world] : std::vector<std::pair<std::string, int>>{{"all", 2}, {"all", 4}, {"pairs", 4}}) {
    const auto ranks = run_ranks(world, self + " --worker " + scenario, "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=1");
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(ranks[r].code, 0) << scenario << " on " << world << ", rank " << r << ": " << ranks[r].out
                                  << ranks[r].err;
    }
  }
}

TEST(DistributedAttention, NamesWhatItCannotSplit) {
  auto alone = make_single_process_comm();
  auto t = torch::zeros({2, 4, 2, 3});
  DistributedAttention attention([](const torch::Tensor& q, const torch::Tensor&, const torch::Tensor&) { return q; },
                                 alone);
  expect_error([&] { attention.forward(t, t, t, 2); }, "batch_dim is 2; 0 ([batch, sequence, heads, head_dim])");
  expect_error([&] { attention.forward(t.view({8, 2, 3}), t, t); }, "must be 4-dimensional");
  expect_error([&] { seq_all_to_all(t, alone, 4, 1); }, "scatter_dim 4 and gather_dim 1 must be dimensions");
  EXPECT_THROW(DistributedAttention(nullptr, alone), std::invalid_argument);
}

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) { return dscpp::testing::worker_or_tests(argc, argv, dscpp::testing::worker); }
