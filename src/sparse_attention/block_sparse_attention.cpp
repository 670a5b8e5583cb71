// Block-sparse attention by row groups (BlockSparsePlan): the (head, block row) pairs of the layout are grouped by how
// many blocks the row attends to; a group's rows gather their query block and their key / value blocks, and compute
// scores (B, rows, block, count·block), one softmax per query and the product with V in three batched calls. The masks
// are gathered block by block in the same way; the groups' outputs are put in place with one gather.
#include "dscpp/sparse_attention/block_sparse_attention.h"

#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace dscpp::sparse_attention {
namespace {

std::string shape(const torch::Tensor& t) {
  std::string s = "(";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + ")";
}

void check(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const BlockSparsePlan& plan,
           const AttentionMasks& m) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("block_sparse_attention: " + what); };
  if (q.dim() != 4 || !q.sizes().equals(k.sizes()) || !q.sizes().equals(v.sizes())) {
    fail("q, k and v must be (batch, heads, seq_len, head_dim) alike, got " + shape(q) + ", " + shape(k) + ", " +
         shape(v));
  }
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), block = plan.block();
  if (T % block != 0) {
    fail("the sequence length " + std::to_string(T) + " must be divisible by the block size " + std::to_string(block));
  }
  if (plan.heads() != H || plan.blocks() != T / block) {
    fail("the layout must be (heads, seq_len/block, seq_len/block) = (" + std::to_string(H) + ", " +
         std::to_string(T / block) + ", " + std::to_string(T / block) + "), got (" + std::to_string(plan.heads()) +
         ", " + std::to_string(plan.blocks()) + ", " + std::to_string(plan.blocks()) + ")");
  }
  if (plan.causal() != m.causal) fail("the plan was made with causal " + std::to_string(plan.causal()) + ", the masks say " + std::to_string(m.causal));
  if (plan.device() != q.device()) fail("the plan's index tensors are on " + plan.device().str() + ", q on " + q.device().str());
  if (m.key_padding_mask.defined() && (m.key_padding_mask.dim() != 2 || m.key_padding_mask.size(0) != B ||
                                       m.key_padding_mask.size(1) != T)) {
    fail("key_padding_mask must be (batch, seq_len) = (" + std::to_string(B) + ", " + std::to_string(T) + "), got " +
         shape(m.key_padding_mask));
  }
  if (m.attn_mask.defined() && (m.attn_mask.dim() != 2 || m.attn_mask.size(0) != T || m.attn_mask.size(1) != T)) {
    fail("attn_mask must be (seq_len, seq_len), got " + shape(m.attn_mask));
  }
  if (m.rpe.defined() && (m.rpe.dim() < 2 || m.rpe.dim() > 4 || m.rpe.size(-1) != T || m.rpe.size(-2) != T)) {
    fail("rpe must be (seq_len, seq_len), (heads, seq_len, seq_len) or (batch, heads, seq_len, seq_len), got " +
         shape(m.rpe));
  }
}

// The layout against q's heads and length, before a plan is made of it.
void check_layout(const torch::Tensor& q, const torch::Tensor& layout, int64_t block) {
  if (q.dim() != 4) return;  // check() names the shapes
  const int64_t H = q.size(1), T = q.size(2);
  if (block < 1 || T % block != 0) {
    throw std::invalid_argument("block_sparse_attention: the sequence length " + std::to_string(T) +
                                " must be divisible by the block size " + std::to_string(block));
  }
  if (layout.dim() != 3 || layout.size(0) != H || layout.size(1) != T / block || layout.size(2) != T / block) {
    throw std::invalid_argument("block_sparse_attention: the layout must be (heads, seq_len/block, seq_len/block) = (" +
                                std::to_string(H) + ", " + std::to_string(T / block) + ", " +
                                std::to_string(T / block) + "), got " + shape(layout));
  }
}

// A mask's additive form: "mul" masks are 0 where masked (→ -inf), 1 elsewhere (→ 0).
torch::Tensor additive(const torch::Tensor& mask, bool mul, torch::ScalarType dtype, torch::Device device) {
  const auto m = mask.to(device, dtype);
  if (!mul) return m;
  return torch::where(m == 0, torch::full({}, -std::numeric_limits<double>::infinity(), m.options()),
                      torch::zeros({}, m.options()));
}

// Scores and softmax in fp32 for 16-bit inputs (DeepSpeed's kernels too), else in the inputs' dtype.
torch::ScalarType scores_dtype(const torch::Tensor& q) {
  return q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat32;
}

double scale_of(const AttentionMasks& m, int64_t head_dim) {
  return m.scale.value_or(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

torch::Tensor rpe4(const torch::Tensor& rpe) {  // (B or 1, H or 1, T, T)
  return rpe.dim() == 2 ? rpe.unsqueeze(0).unsqueeze(0) : rpe.dim() == 3 ? rpe.unsqueeze(0) : rpe;
}

}  // namespace

BlockSparsePlan::BlockSparsePlan(const torch::Tensor& layout, int64_t block, bool causal, torch::Device device)
    : block_(block), causal_(causal), device_(device) {
  if (layout.dim() != 3 || layout.size(1) != layout.size(2) || block < 1) {
    throw std::invalid_argument("BlockSparsePlan: a layout is (heads, blocks, blocks) with a block size >= 1, got " +
                                shape(layout) + " and " + std::to_string(block));
  }
  heads_ = layout.size(0);
  blocks_ = layout.size(1);
  const auto cpu = layout.to(torch::kCPU, torch::kLong).contiguous();
  const auto* cells = cpu.data_ptr<int64_t>();
  struct Rows {
    std::vector<int64_t> heads, rows, cols;
  };
  std::map<int64_t, Rows> by_count;
  std::vector<std::pair<int64_t, int64_t>> where(heads_ * blocks_, {-1, 0});  // (count, index in its group)
  for (int64_t h = 0; h < heads_; ++h) {
    for (int64_t r = 0; r < blocks_; ++r) {
      std::vector<int64_t> mine;
      for (int64_t c = 0; c < (causal ? r + 1 : blocks_); ++c) {
        if (cells[(h * blocks_ + r) * blocks_ + c]) mine.push_back(c);
      }
      if (mine.empty()) continue;
      const int64_t n = static_cast<int64_t>(mine.size());
      Rows& group = by_count[n];
      where[h * blocks_ + r] = {n, static_cast<int64_t>(group.heads.size())};
      group.heads.push_back(h);
      group.rows.push_back(r);
      group.cols.insert(group.cols.end(), mine.begin(), mine.end());
      scored_blocks_ += n;
    }
  }
  const auto index = torch::TensorOptions().dtype(torch::kLong);
  std::map<int64_t, int64_t> offset;  // a group's first row in the concatenated outputs
  int64_t total = 0;
  for (const auto& [count, rows] : by_count) {
    const int64_t n = static_cast<int64_t>(rows.heads.size());
    offset[count] = total;
    total += n;
    groups_.push_back({count, torch::tensor(rows.heads, index).to(device), torch::tensor(rows.rows, index).to(device),
                       torch::tensor(rows.cols, index).view({n, count}).to(device)});
  }
  std::vector<int64_t> placement(heads_ * blocks_);
  for (size_t i = 0; i < where.size(); ++i) {
    placement[i] = where[i].first < 0 ? total : offset[where[i].first] + where[i].second;
  }
  placement_ = torch::tensor(placement, index).to(device);
}

torch::Tensor block_sparse_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& layout, int64_t block, const AttentionMasks& masks) {
  check_layout(q, layout, block);
  return block_sparse_attention(q, k, v, BlockSparsePlan(layout, block, masks.causal, q.device()), masks);
}

torch::Tensor block_sparse_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const BlockSparsePlan& plan, const AttentionMasks& m) {
  check(q, k, v, plan, m);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), nb = T / plan.block(),
                block = plan.block();
  const auto scores_type = scores_dtype(q);
  // fp16 products can overflow before the scale: scores from fp32 copies (bf16 has fp32's range).
  const bool upcast = q.scalar_type() == torch::kHalf;
  const auto qb = (upcast ? q.to(torch::kFloat32) : q).reshape({B, H, nb, block, D});
  const auto kb = (upcast ? k.to(torch::kFloat32) : k).reshape({B, H, nb, block, D});
  const auto vb = v.reshape({B, H, nb, block, D});
  const torch::Tensor kpm =
      m.key_padding_mask.defined()
          ? additive(m.key_padding_mask, m.key_padding_mask_mul, scores_type, q.device()).reshape({B, nb, block})
          : torch::Tensor();
  const torch::Tensor am = m.attn_mask.defined() ? additive(m.attn_mask, m.attn_mask_mul, scores_type, q.device())
                                                        .reshape({nb, block, nb, block})
                                                        .permute({0, 2, 1, 3})  // (row, col, i, j)
                                                 : torch::Tensor();
  const torch::Tensor rpe = m.rpe.defined() ? rpe4(m.rpe).to(q.device(), scores_type) : torch::Tensor();
  const double scale = scale_of(m, D);
  using torch::indexing::Slice;
  const auto all = Slice();
  std::vector<torch::Tensor> outputs;  // per group (B, n, block, D), in the plan's order
  for (const auto& g : plan.groups()) {
    const int64_t n = g.heads.size(0), count = g.count;
    const auto hc = g.heads.unsqueeze(1).expand({n, count});
    const auto rc = g.rows.unsqueeze(1).expand({n, count});
    const auto query = qb.index({all, g.heads, g.rows});                         // (B, n, block, D)
    const auto key = kb.index({all, hc, g.cols}).reshape({B, n, count * block, D});  // (B, n, count·block, D)
    const auto value = vb.index({all, hc, g.cols}).reshape({B, n, count * block, D});
    auto scores = torch::matmul(query, key.transpose(-1, -2)).to(scores_type) * scale;  // (B, n, block, count·block)
    if (rpe.defined()) {  // rpe's (row, col) blocks of each pair: (B|1, n, count, block, block)
      const auto rb = rpe.reshape({rpe.size(0), rpe.size(1), nb, block, nb, block}).permute({0, 1, 2, 4, 3, 5});
      const auto rh = rpe.size(1) == 1 ? torch::zeros_like(hc) : hc;
      scores = scores + rb.index({all, rh, rc, g.cols})
                            .permute({0, 1, 3, 2, 4})
                            .reshape({rpe.size(0), n, block, count * block});
    }
    if (kpm.defined()) scores = scores + kpm.index({all, g.cols}).reshape({B, n, 1, count * block});
    if (am.defined()) {
      scores = scores + am.index({rc, g.cols}).permute({0, 2, 1, 3}).reshape({1, n, block, count * block});
    }
    if (m.causal) {  // keys after the query: query position row·block + i, key position col·block + j
      const auto index = torch::TensorOptions().dtype(torch::kLong).device(q.device());
      const auto query_pos = (g.rows * block).view({n, 1, 1}) + torch::arange(block, index).view({1, block, 1});
      const auto key_pos = ((g.cols * block).view({n, count, 1}) + torch::arange(block, index).view({1, 1, block}))
                               .view({n, 1, count * block});
      scores = scores.masked_fill((key_pos > query_pos).unsqueeze(0), -std::numeric_limits<double>::infinity());
    }
    const auto probs = torch::softmax(scores, -1).to(v.scalar_type());
    outputs.push_back(torch::matmul(probs, value));
  }
  // Every (head, row) takes its output from the groups' concatenation, or the zero row after it: one gather, whose
  // backward scatters each row's gradient back to its group.
  outputs.push_back(torch::zeros({B, 1, block, D}, v.options()));
  return torch::cat(outputs, 1).index_select(1, plan.placement()).view({B, H, T, D});
}

torch::Tensor masked_dense_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& layout, int64_t block, const AttentionMasks& m) {
  check_layout(q, layout, block);
  check(q, k, v, BlockSparsePlan(layout, block, m.causal, q.device()), m);
  const int64_t B = q.size(0), T = q.size(2), D = q.size(3);
  const double inf = std::numeric_limits<double>::infinity();
  const auto dtype = scores_dtype(q);
  auto scores = torch::matmul(q, k.transpose(-1, -2)).to(dtype) * scale_of(m, D);  // (B, H, T, T)
  if (m.rpe.defined()) scores = scores + rpe4(m.rpe).to(q.device(), dtype);
  if (m.key_padding_mask.defined()) {
    scores = scores + additive(m.key_padding_mask, m.key_padding_mask_mul, dtype, q.device()).reshape({B, 1, 1, T});
  }
  if (m.attn_mask.defined()) scores = scores + additive(m.attn_mask, m.attn_mask_mul, dtype, q.device());
  if (m.causal) scores = scores.masked_fill(torch::ones({T, T}, torch::kBool).triu(1).to(q.device()), -inf);
  const auto keep = layout.to(q.device()).repeat_interleave(block, 1).repeat_interleave(block, 2).unsqueeze(0) != 0;
  scores = scores.masked_fill(~keep, -inf);
  auto out = torch::matmul(torch::softmax(scores, -1).to(v.scalar_type()), v);
  // A row outside the layout altogether: zeros, as the block-sparse attention leaves it.
  const auto empty_row = (~keep).all(-1, /*keepdim=*/true);
  return out.masked_fill(empty_row, 0);
}

}  // namespace dscpp::sparse_attention
