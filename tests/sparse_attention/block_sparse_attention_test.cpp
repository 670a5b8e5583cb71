// Block-sparse attention against the same attention computed densely with everything outside the layout at -inf:
// outputs and the gradients of q, k, v (and rpe) within 1e-5, for every layout kind, with each mask and the causal
// flag; the work done is the layout's blocks; bad shapes are errors naming them.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "dscpp/monitor/memory_tracker.h"
#include "dscpp/sparse_attention/block_sparse_attention.h"
#include "dscpp/sparse_attention/python_random.h"
#include "dscpp/sparse_attention/sparsity_config.h"

namespace dscpp::sparse_attention {
namespace {

constexpr int64_t kBatch = 2, kHeads = 4, kBlock = 4, kSeq = 32, kDim = 8;

SparsityConfig config(const std::string& mode) {
  SparsityConfig c;
  c.mode = mode;
  c.num_heads = kHeads;
  c.block = kBlock;
  if (mode == "fixed") {
    c.num_local_blocks = 2;
    c.different_layout_per_head = true;
    c.num_different_global_patterns = 2;
    c.horizontal_global_attention = true;
  } else if (mode == "variable") {
    c.num_random_blocks = 1;
    c.local_window_blocks = {1, 2, 3};
    c.global_block_indices = {0, 5};
    c.global_block_end_indices = std::vector<int64_t>{2, 6};
  } else if (mode == "bigbird") {
    c.num_random_blocks = 2;
    c.different_layout_per_head = true;
  } else if (mode == "bslongformer") {
    c.global_block_indices = {3};
  }
  return c;
}

torch::Tensor layout_of(const SparsityConfig& c) {
  PythonRandom random(1234);
  return make_layout(c, kSeq, [&](int64_t n, int64_t k) { return random.sample(n, k); });
}

struct Inputs {
  torch::Tensor q, k, v;
};

Inputs inputs() {
  torch::manual_seed(0);
  auto make = [] { return torch::randn({kBatch, kHeads, kSeq, kDim}, torch::kDouble).set_requires_grad(true); };
  return {make(), make(), make()};
}

// Output and q/k/v gradients of `f` under a fixed upstream gradient.
std::vector<torch::Tensor> run(const Inputs& in, const std::function<torch::Tensor()>& f) {
  for (auto* t : {&in.q, &in.k, &in.v}) {
    if (t->grad().defined()) t->mutable_grad().zero_();
  }
  const auto out = f();
  const auto upstream = torch::linspace(-1, 1, out.numel(), torch::kDouble).view(out.sizes());
  (out * upstream).sum().backward();
  return {out.detach().clone(), in.q.grad().clone(), in.k.grad().clone(), in.v.grad().clone()};
}

void expect_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
                  const std::string& what) {
  const char* names[] = {"output", "dq", "dk", "dv"};
  for (size_t i = 0; i < want.size(); ++i) {
    const auto finite = torch::isfinite(want[i]);
    ASSERT_TRUE(torch::equal(finite, torch::isfinite(got[i]))) << what << " " << names[i] << ": NaN where the other has none";
    EXPECT_LT((got[i] - want[i]).masked_fill(~finite, 0).abs().max().item<double>(), 1e-5) << what << " " << names[i];
  }
}

TEST(BlockSparseAttention, EqualsDenseAttentionUnderTheLayoutForEveryLayout) {
  const auto in = inputs();
  for (const std::string mode : {"dense", "fixed", "variable", "bigbird", "bslongformer", "local"}) {
    const auto layout = layout_of(config(mode));
    const auto sparse = run(in, [&] { return block_sparse_attention(in.q, in.k, in.v, layout, kBlock); });
    const auto dense = run(in, [&] { return masked_dense_attention(in.q, in.k, in.v, layout, kBlock); });
    expect_close(sparse, dense, mode);
  }
}

TEST(BlockSparseAttention, MasksAndCausalAsTheDenseAttention) {
  const auto in = inputs();
  auto c = config("bigbird");
  c.unidirectional = true;
  c.num_random_blocks = 1;  // row 0 has one block to draw from (more is DeepSpeed's "Sample larger than population")
  const auto layout = layout_of(c);
  torch::manual_seed(1);
  AttentionMasks add_masks;
  add_masks.key_padding_mask = torch::randn({kBatch, kSeq}, torch::kDouble);
  add_masks.attn_mask = torch::randn({kSeq, kSeq}, torch::kDouble);
  add_masks.attn_mask_mul = false;
  add_masks.scale = 0.3;
  AttentionMasks mul_masks;  // DeepSpeed's defaults for SparseSelfAttention: key padding added, attention multiplied
  mul_masks.key_padding_mask = torch::zeros({kBatch, kSeq}, torch::kDouble);
  mul_masks.key_padding_mask.index_put_({0, torch::indexing::Slice(kSeq - 5, kSeq)}, -1e4);
  mul_masks.attn_mask = torch::ones({kSeq, kSeq}, torch::kDouble).tril();
  AttentionMasks causal;
  causal.causal = true;
  AttentionMasks rpe;
  rpe.rpe = torch::randn({kHeads, kSeq, kSeq}, torch::kDouble);
  rpe.causal = true;
  for (const auto& [name, masks] : std::vector<std::pair<std::string, AttentionMasks>>{
           {"added masks", add_masks}, {"multiplied mask", mul_masks}, {"causal", causal}, {"rpe", rpe}}) {
    const auto sparse = run(in, [&] { return block_sparse_attention(in.q, in.k, in.v, layout, kBlock, masks); });
    const auto dense = run(in, [&] { return masked_dense_attention(in.q, in.k, in.v, layout, kBlock, masks); });
    expect_close(sparse, dense, name);
  }
  // The causal flag is the multiplied lower-triangular mask.
  const auto flag = block_sparse_attention(in.q, in.k, in.v, layout, kBlock, causal);
  const auto tril = block_sparse_attention(in.q, in.k, in.v, layout, kBlock, mul_masks);
  AttentionMasks tril_only;
  tril_only.attn_mask = mul_masks.attn_mask;
  EXPECT_TRUE(torch::allclose(flag, block_sparse_attention(in.q, in.k, in.v, layout, kBlock, tril_only), 0, 1e-12));
}

TEST(BlockSparseAttention, DenseLayoutIsPlainAttentionAndFloat32Holds) {
  const auto in = inputs();
  auto dense = config("dense");
  const auto layout = layout_of(dense);
  const auto plain = torch::matmul(torch::softmax(torch::matmul(in.q, in.k.transpose(-1, -2)) / std::sqrt(kDim), -1), in.v);
  EXPECT_LT((block_sparse_attention(in.q, in.k, in.v, layout, kBlock) - plain).abs().max().item<double>(), 1e-12);
  const auto q = in.q.detach().to(torch::kFloat), k = in.k.detach().to(torch::kFloat), v = in.v.detach().to(torch::kFloat);
  const auto fixed = layout_of(config("fixed"));
  EXPECT_LT((block_sparse_attention(q, k, v, fixed, kBlock) - masked_dense_attention(q, k, v, fixed, kBlock))
                .abs()
                .max()
                .item<double>(),
            1e-5);
}

// The point of a layout: the work is its blocks' (the plan counts them) and so is the memory — at 4096 positions a
// local window of 3 blocks holds under 5% of the (T, T) scores a dense attention would, forward and backward.
TEST(BlockSparseAttention, WorkAndMemoryAreTheLayoutsBlocks) {
  SparsityConfig local;
  local.mode = "local";
  local.num_heads = 2;
  local.block = 16;
  local.unidirectional = true;
  const int64_t T = 4096, nb = T / 16;
  const auto layout = make_layout(local, T);
  const BlockSparsePlan plan(layout, 16, /*causal=*/true);
  EXPECT_EQ(plan.scored_blocks(), 2 * (2 * nb - 1));  // each row its own block and the one before
  EXPECT_EQ(plan.groups().size(), 2u);                // row 0 attends to 1 block, every other row to 2
  CpuMemoryTracker::install();
  torch::manual_seed(0);
  auto q = torch::randn({1, 2, T, 16}).set_requires_grad(true), k = torch::randn({1, 2, T, 16}),
       v = torch::randn({1, 2, T, 16});
  AttentionMasks causal;
  causal.causal = true;
  CpuMemoryTracker::reset_peak();
  const int64_t before = CpuMemoryTracker::allocated();
  block_sparse_attention(q, k, v, plan, causal).sum().backward();
  const double dense_scores = 2.0 * T * T * 4;  // one (H, T, T) fp32 tensor
  const double sparse_peak = static_cast<double>(CpuMemoryTracker::peak() - before);
  EXPECT_LT(sparse_peak / dense_scores, 0.05);
  // The same measure sees the dense attention's scores (so the bound above is not the tracker seeing nothing).
  q.mutable_grad() = torch::Tensor();
  CpuMemoryTracker::reset_peak();
  masked_dense_attention(q, k, v, layout, 16, causal).sum().backward();
  const double dense_peak = static_cast<double>(CpuMemoryTracker::peak() - before);
  EXPECT_GT(dense_peak / dense_scores, 1.0) << sparse_peak;
  // A bidirectional layout under the causal flag: the blocks after the diagonal are not computed, the output is the same.
  auto bigbird = config("bigbird");
  const auto both_ways = layout_of(bigbird);
  const BlockSparsePlan all_blocks(both_ways, kBlock, false), past_blocks(both_ways, kBlock, true);
  EXPECT_LT(past_blocks.scored_blocks(), all_blocks.scored_blocks());
  const auto in = inputs();
  AttentionMasks causal_masks;
  causal_masks.causal = true;
  EXPECT_LT((block_sparse_attention(in.q, in.k, in.v, past_blocks, causal_masks) -
             masked_dense_attention(in.q, in.k, in.v, both_ways, kBlock, causal_masks))
                .abs()
                .max()
                .item<double>(),
            1e-12);
}

// A row outside the layout gives zeros; one whose blocks are all masked NaN, as the dense softmax does.
TEST(BlockSparseAttention, EmptyAndFullyMaskedRows) {
  const auto in = inputs();
  auto layout = torch::zeros({kHeads, kSeq / kBlock, kSeq / kBlock}, torch::kLong);
  layout.index_put_({torch::indexing::Slice(), torch::indexing::Slice(1), 0}, 1);  // rows 1.. see block 0
  const auto out = block_sparse_attention(in.q, in.k, in.v, layout, kBlock);
  EXPECT_TRUE(torch::equal(out.index({torch::indexing::Slice(), torch::indexing::Slice(), torch::indexing::Slice(0, kBlock)}),
                           torch::zeros({kBatch, kHeads, kBlock, kDim}, torch::kDouble)));
  AttentionMasks masks;
  masks.key_padding_mask = torch::ones({kBatch, kSeq}, torch::kDouble);
  masks.key_padding_mask.index_put_({torch::indexing::Slice(), torch::indexing::Slice(0, kBlock)}, 0);
  masks.key_padding_mask_mul = true;
  const auto masked = block_sparse_attention(in.q, in.k, in.v, layout, kBlock, masks);
  EXPECT_TRUE(torch::isnan(masked.index({0, 0, kBlock + 1})).all().item<bool>());
}

TEST(BlockSparseAttention, NamesBadShapes) {
  const auto in = inputs();
  const auto layout = layout_of(config("fixed"));
  auto expect_error = [&](const std::function<void()>& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no error; expected " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  expect_error([&] { block_sparse_attention(in.q, in.k, in.v, layout, 5); },
               "the sequence length 32 must be divisible by the block size 5");
  expect_error([&] { block_sparse_attention(in.q, in.k, in.v, layout.index({torch::indexing::Slice(0, 2)}), kBlock); },
               "the layout must be (heads, seq_len/block, seq_len/block) = (4, 8, 8), got (2, 8, 8)");
  AttentionMasks masks;
  masks.key_padding_mask = torch::ones({kBatch, kSeq + 1});
  expect_error([&] { block_sparse_attention(in.q, in.k, in.v, layout, kBlock, masks); },
               "key_padding_mask must be (batch, seq_len) = (2, 32), got (2, 33)");
}

}  // namespace
}  // namespace dscpp::sparse_attention
