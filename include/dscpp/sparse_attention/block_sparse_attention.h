// Block-sparse attention: softmax(scale·QKᵀ + masks)·V computed only on a layout's blocks (sparsity_config.h), as
// DeepSpeed's SparseSelfAttention computes it with its block-sparse kernels (scores of the layout's blocks, a softmax
// over each row's blocks, their product with V). Nothing of size (T, T) is made: the work and the memory are the
// layout's blocks' — the rows of a head that attend to the same number of blocks are computed together, each row
// gathering its key and value blocks. Differentiable (torch ops throughout).
#pragma once

#include <torch/torch.h>

#include <optional>

namespace dscpp::sparse_attention {

struct AttentionMasks {
  std::optional<double> scale;  // default 1/sqrt(head_dim)
  // Added to the scaled scores (DeepSpeed's rpe): (T, T), (H, T, T) or (B, H, T, T); only the layout's blocks read.
  torch::Tensor rpe;
  // (B, T) over the keys; "add": added, "mul": 0 masks the key out (DeepSpeed's key_padding_mask_mode, default add).
  torch::Tensor key_padding_mask;
  bool key_padding_mask_mul = false;
  // (T, T); "mul" (DeepSpeed's attn_mask_mode default): 0 masks the pair out, "add": added.
  torch::Tensor attn_mask;
  bool attn_mask_mul = true;
  // Each query attends to keys at or before its position only (a causal model's mask, without a (T, T) tensor).
  bool causal = false;
};

// q, k, v (B, H, T, D); layout (H, T/block, T/block) of 0/1. Returns (B, H, T, D). A row whose blocks are all masked
// gives NaN, as a dense softmax over -inf does; a row with no block in the layout gives zeros.
// std::invalid_argument naming the shapes when they disagree.
torch::Tensor block_sparse_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& layout, int64_t block, const AttentionMasks& masks = {});

// The same attention computed densely: the (T, T) scores with everything outside the layout at -inf. The reference
// the tests hold the block-sparse one to, and the dense baseline of bench/long_context.
torch::Tensor masked_dense_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& layout, int64_t block, const AttentionMasks& masks = {});

}  // namespace dscpp::sparse_attention
