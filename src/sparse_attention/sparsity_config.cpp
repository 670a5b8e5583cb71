// DeepSpeed's sparsity layouts, rule by rule in DeepSpeed's order (each head: random blocks, then local / sliding
// windows, then global blocks; then head 0's layout copied to the others unless each head has its own).
#include "dscpp/sparse_attention/sparsity_config.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dscpp::sparse_attention {
namespace {

using torch::indexing::None;
using torch::indexing::Slice;

std::string str(int64_t n) { return std::to_string(n); }

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument("sparse_attention: " + message);
}

// Rows [row, row+1) of head h, columns [begin, end): set.
void set(torch::Tensor& layout, int64_t h, int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end) {
  if (row_begin >= row_end || col_begin >= col_end) return;
  layout.index_put_({h, Slice(row_begin, row_end), Slice(col_begin, col_end)}, 1);
}

void local_window(torch::Tensor& layout, int64_t h, int64_t begin, int64_t end, bool unidirectional) {
  for (int64_t row = begin; row < end; ++row) set(layout, h, row, row + 1, begin, unidirectional ? row + 1 : end);
}

// BigBird's and Longformer's window: w = n/2 blocks either side (then cut to the past when unidirectional, for the
// local layout only; BigBird and Longformer cut the whole layout at the end instead).
void sliding_window(torch::Tensor& layout, int64_t h, int64_t window, bool only_past) {
  const int64_t blocks = layout.size(1), w = window / 2;
  require(blocks >= window, "num_sliding_window_blocks " + str(window) + " must not exceed the " + str(blocks) +
                                " blocks of a row");
  for (int64_t row = 0; row < blocks; ++row) {
    set(layout, h, row, row + 1, std::max<int64_t>(0, row - w), only_past ? row + 1 : std::min(row + w + 1, blocks));
  }
}

void random_blocks(torch::Tensor& layout, int64_t h, const SparsityConfig& c, bool only_past,
                   const BlockSampler& sample) {
  const int64_t blocks = layout.size(1);
  require(blocks >= c.num_random_blocks, "num_random_blocks " + str(c.num_random_blocks) +
                                             " must not exceed the " + str(blocks) + " blocks of a row");
  if (c.num_random_blocks == 0) return;  // random.sample(…, 0) draws nothing
  if (!sample) throw std::invalid_argument("sparse_attention: the " + c.mode + " layout draws random blocks: pass a sampler");
  for (int64_t row = 0; row < blocks; ++row) {
    for (int64_t col : sample(only_past ? row + 1 : blocks, c.num_random_blocks)) set(layout, h, row, row + 1, col, col + 1);
  }
}

// Global blocks by index or [start, end) range: columns attended by every row (from the block's own row on when
// unidirectional), and with `rows` the blocks' rows attending to everything.
void global_blocks(torch::Tensor& layout, int64_t h, const SparsityConfig& c, bool rows, bool unidirectional) {
  const int64_t blocks = layout.size(1);
  for (size_t i = 0; i < c.global_block_indices.size(); ++i) {
    const int64_t begin = c.global_block_indices[i];
    if (begin >= blocks) continue;
    const int64_t end = c.global_block_end_indices ? std::min((*c.global_block_end_indices)[i], blocks) : begin + 1;
    if (rows) set(layout, h, begin, end, 0, blocks);
    set(layout, h, unidirectional ? begin : 0, blocks, begin, end);
  }
}

void fixed(torch::Tensor& layout, int64_t h, const SparsityConfig& c) {
  const int64_t blocks = layout.size(1), nl = c.num_local_blocks, ng = c.num_global_blocks;
  for (int64_t i = 0; i < blocks; i += nl) local_window(layout, h, i, std::min(i + nl, blocks), c.unidirectional);
  // Global blocks: the last ng of each window for pattern 0, the ng before them for pattern 1, …
  const int64_t first = nl - (1 + h % c.num_different_global_patterns) * ng;
  const int64_t whole_windows_end = blocks - blocks % nl;
  // Bounds as Python's slices read them (DeepSpeed indexes with them): a negative one counts from the end.
  auto py = [blocks](int64_t bound) { return bound < 0 ? std::max<int64_t>(0, bound + blocks) : std::min(bound, blocks); };
  auto global = [&](int64_t begin, int64_t end) {
    set(layout, h, py(c.unidirectional ? begin : 0), blocks, py(begin), py(end));
    if (c.horizontal_global_attention) set(layout, h, py(begin), py(end), 0, blocks);
  };
  for (int64_t i = first; i < whole_windows_end; i += nl) global(i, i + ng);
  if (whole_windows_end < blocks) {  // a short last window: its global blocks as far in as fits (with fewer blocks
    // than num_global_blocks DeepSpeed's start goes negative, and its slices wrap: so do these)
    const int64_t begin = std::min(whole_windows_end + first, blocks - ng);
    global(begin, begin + ng);
  }
}

void variable_local(torch::Tensor& layout, int64_t h, const SparsityConfig& c) {
  const int64_t blocks = layout.size(1);
  int64_t begin = 0, end = 0;
  for (int64_t size : c.local_window_blocks) {
    end = std::min(end + size, blocks);
    local_window(layout, h, begin, end, c.unidirectional);
    begin += size;
  }
  const int64_t size = c.local_window_blocks.back();  // the rest in windows of the last size
  for (int64_t i = begin; i < blocks; i += size) local_window(layout, h, i, std::min(i + size, blocks), c.unidirectional);
}

}  // namespace

torch::Tensor make_layout(const SparsityConfig& c, int64_t seq_len, const BlockSampler& sample) {
  c.validate();
  if (seq_len % c.block != 0) {
    throw std::invalid_argument("sparse_attention: the sequence length " + str(seq_len) +
                                " must be divisible by the block size " + str(c.block));
  }
  const int64_t blocks = seq_len / c.block;
  auto layout = torch::zeros({c.num_heads, blocks, blocks}, torch::kLong);
  if (c.mode == "dense") return layout.fill_(1);
  for (int64_t h = 0; h < c.layout_heads(); ++h) {
    if (c.mode == "fixed") {
      fixed(layout, h, c);
    } else if (c.mode == "variable") {
      random_blocks(layout, h, c, /*only_past=*/false, sample);  // DeepSpeed draws from the whole row either way
      variable_local(layout, h, c);
      global_blocks(layout, h, c, c.horizontal_global_attention, c.unidirectional);
    } else if (c.mode == "bigbird") {
      random_blocks(layout, h, c, c.unidirectional, sample);
      sliding_window(layout, h, c.num_sliding_window_blocks, /*only_past=*/false);
      require(blocks >= c.num_global_blocks, "num_global_blocks " + str(c.num_global_blocks) +
                                                 " must not exceed the " + str(blocks) + " blocks of a row");
      set(layout, h, 0, c.num_global_blocks, 0, blocks);
      set(layout, h, 0, blocks, 0, c.num_global_blocks);
    } else if (c.mode == "bslongformer") {
      sliding_window(layout, h, c.num_sliding_window_blocks, /*only_past=*/false);
      global_blocks(layout, h, c, /*rows=*/true, /*unidirectional=*/false);
    } else {  // local
      sliding_window(layout, h, c.num_sliding_window_blocks, c.unidirectional);
    }
    // BigBird and Longformer drop what attends to the future after building the bidirectional pattern.
    if (c.unidirectional && (c.mode == "bigbird" || c.mode == "bslongformer")) layout[h].tril_();
  }
  if (!c.different_layout_per_head) layout.index_put_({Slice(1, None)}, layout[0]);
  return layout;
}

}  // namespace dscpp::sparse_attention
