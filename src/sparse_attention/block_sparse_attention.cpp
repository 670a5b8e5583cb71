// Block-sparse attention by row groups: the (head, block row) pairs of the layout are grouped by how many blocks the
// row attends to; a group's rows gather their query block and their key / value blocks, and compute scores
// (B, rows, block, count·block), one softmax per query and the product with V in three batched calls. The masks are
// gathered block by block in the same way.
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

void check(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& layout,
           int64_t block, const AttentionMasks& m) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("block_sparse_attention: " + what); };
  if (q.dim() != 4 || !q.sizes().equals(k.sizes()) || !q.sizes().equals(v.sizes())) {
    fail("q, k and v must be (batch, heads, seq_len, head_dim) alike, got " + shape(q) + ", " + shape(k) + ", " +
         shape(v));
  }
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2);
  if (block < 1 || T % block != 0) {
    fail("the sequence length " + std::to_string(T) + " must be divisible by the block size " + std::to_string(block));
  }
  if (layout.dim() != 3 || layout.size(0) != H || layout.size(1) != T / block || layout.size(2) != T / block) {
    fail("the layout must be (heads, seq_len/block, seq_len/block) = (" + std::to_string(H) + ", " +
         std::to_string(T / block) + ", " + std::to_string(T / block) + "), got " + shape(layout));
  }
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

// A mask's additive form: "mul" masks are 0 where masked (→ -inf), 1 elsewhere (→ 0).
torch::Tensor additive(const torch::Tensor& mask, bool mul, torch::ScalarType dtype) {
  const auto m = mask.to(dtype);
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

torch::Tensor block_sparse_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& layout, int64_t block, const AttentionMasks& m) {
  check(q, k, v, layout, block, m);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), nb = T / block;
  const auto float_scores = scores_dtype(q);
  const auto qb = q.reshape({B, H, nb, block, D}), kb = k.reshape({B, H, nb, block, D}),
             vb = v.reshape({B, H, nb, block, D});
  const torch::Tensor kpm = m.key_padding_mask.defined()
                                ? additive(m.key_padding_mask, m.key_padding_mask_mul, float_scores).view({B, nb, block})
                                : torch::Tensor();
  const torch::Tensor am = m.attn_mask.defined() ? additive(m.attn_mask, m.attn_mask_mul, float_scores)
                                                        .view({nb, block, nb, block})
                                                        .permute({0, 2, 1, 3})  // (row, col, i, j)
                                                 : torch::Tensor();
  const torch::Tensor rpe = m.rpe.defined() ? rpe4(m.rpe).to(float_scores) : torch::Tensor();
  const double scale = scale_of(m, D);

  // The layout's rows grouped by their block count: count → (head, row) pairs and their columns.
  const auto cpu_layout = layout.to(torch::kCPU, torch::kLong).contiguous();
  const auto* cells = cpu_layout.data_ptr<int64_t>();
  std::map<int64_t, std::vector<int64_t>> heads, rows, cols;
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t r = 0; r < nb; ++r) {
      std::vector<int64_t> mine;
      for (int64_t c = 0; c < nb; ++c) {
        if (cells[(h * nb + r) * nb + c]) mine.push_back(c);
      }
      if (mine.empty()) continue;
      const int64_t n = static_cast<int64_t>(mine.size());
      heads[n].push_back(h);
      rows[n].push_back(r);
      cols[n].insert(cols[n].end(), mine.begin(), mine.end());
    }
  }
  auto out = torch::zeros({B, H, nb, block, D}, q.options());
  const auto index = torch::TensorOptions().dtype(torch::kLong).device(q.device());
  for (const auto& [count, group_heads] : heads) {
    const int64_t n = static_cast<int64_t>(group_heads.size());
    const auto h = torch::tensor(group_heads, index), r = torch::tensor(rows[count], index);
    const auto c = torch::tensor(cols[count], index).view({n, count});
    const auto hc = h.unsqueeze(1).expand({n, count});
    using torch::indexing::Slice;
    const auto all = Slice();
    const auto query = qb.index({all, h, r});                                   // (B, n, block, D)
    const auto key = kb.index({all, hc, c}).reshape({B, n, count * block, D});  // (B, n, count·block, D)
    const auto value = vb.index({all, hc, c}).reshape({B, n, count * block, D});
    auto scores = torch::matmul(query, key.transpose(-1, -2)).to(float_scores) * scale;  // (B, n, block, count·block)
    if (rpe.defined()) {  // rpe's blocks (row, col) of each pair: (B|1, n, block, count·block)
      const auto rb = rpe.view({rpe.size(0), rpe.size(1), nb, block, nb, block}).permute({0, 1, 2, 4, 3, 5});
      const auto rh = rpe.size(1) == 1 ? torch::zeros_like(hc) : hc;
      scores = scores + rb.index({all, rh, r.unsqueeze(1).expand({n, count}), c})  // (B|1, n, count, block, block)
                            .permute({0, 1, 3, 2, 4})
                            .reshape({rpe.size(0), n, block, count * block});
    }
    if (kpm.defined()) scores = scores + kpm.index({all, c}).reshape({B, n, 1, count * block});
    if (am.defined()) {
      scores = scores + am.index({r.unsqueeze(1).expand({n, count}), c})  // (n, count, block, block)
                            .permute({0, 2, 1, 3})
                            .reshape({1, n, block, count * block});
    }
    if (m.causal) {  // keys after the query: query position r·block + i, key position col·block + j
      const auto query_pos = (r * block).view({n, 1, 1}) + torch::arange(block, index).view({1, block, 1});
      const auto key_pos = ((c * block).view({n, count, 1}) + torch::arange(block, index).view({1, 1, block}))
                               .view({n, 1, count * block});
      scores = scores.masked_fill((key_pos > query_pos).unsqueeze(0), -std::numeric_limits<double>::infinity());
    }
    const auto probs = torch::softmax(scores, -1).to(v.scalar_type());
    c10::List<std::optional<at::Tensor>> at_rows;  // (B, n, block, D) into their (head, row)
    at_rows.push_back(std::nullopt);
    at_rows.push_back(h);
    at_rows.push_back(r);
    out = out.index_put(at_rows, torch::matmul(probs, value));
  }
  return out.view({B, H, T, D});
}

torch::Tensor masked_dense_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& layout, int64_t block, const AttentionMasks& m) {
  check(q, k, v, layout, block, m);
  const int64_t B = q.size(0), T = q.size(2), D = q.size(3);
  const double inf = std::numeric_limits<double>::infinity();
  const auto dtype = scores_dtype(q);
  auto scores = torch::matmul(q, k.transpose(-1, -2)).to(dtype) * scale_of(m, D);  // (B, H, T, T)
  if (m.rpe.defined()) scores = scores + rpe4(m.rpe).to(dtype);
  if (m.key_padding_mask.defined()) {
    scores = scores + additive(m.key_padding_mask, m.key_padding_mask_mul, dtype).view({B, 1, 1, T});
  }
  if (m.attn_mask.defined()) scores = scores + additive(m.attn_mask, m.attn_mask_mul, dtype);
  if (m.causal) scores = scores.masked_fill(torch::ones({T, T}, torch::kBool).triu(1).to(q.device()), -inf);
  const auto keep = layout.to(q.device()).repeat_interleave(block, 1).repeat_interleave(block, 2).unsqueeze(0) != 0;
  scores = scores.masked_fill(~keep, -inf);
  auto out = torch::matmul(torch::softmax(scores, -1).to(v.scalar_type()), v);
  // A row outside the layout altogether: zeros, as the block-sparse attention leaves it.
  const auto empty_row = (~keep).all(-1, /*keepdim=*/true);
  return out.masked_fill(empty_row, 0);
}

}  // namespace dscpp::sparse_attention
