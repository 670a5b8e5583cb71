// Block-sparse attention: softmax(scale·QKᵀ + masks)·V computed only on a layout's blocks (sparsity_config.h), as
// DeepSpeed's SparseSelfAttention computes it with its block-sparse kernels (scores of the layout's blocks, a softmax
// over each row's blocks, their product with V). Nothing of size (T, T) is made: the work and the memory are the
// layout's blocks' — the rows of a head that attend to the same number of blocks are computed together, each row
// gathering its key and value blocks. Differentiable (torch ops throughout).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <vector>

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

// A layout made ready to compute with, once per layout and sequence length (as DeepSpeed caches its kernels' lookup
// tables per length): its (head, block row) pairs grouped by how many blocks they attend to, each group's heads,
// rows and columns as index tensors on the device, and where each pair's output goes. With `causal`, blocks wholly
// after the diagonal are dropped (every score in them would be masked).
class BlockSparsePlan {
 public:
  // layout (H, nb, nb) of 0/1 on any device (read once, on the host). std::invalid_argument for another shape.
  BlockSparsePlan(const torch::Tensor& layout, int64_t block, bool causal, torch::Device device = torch::kCPU);

  struct Group {
    int64_t count = 0;        // blocks each row attends to
    torch::Tensor heads;      // (n) int64
    torch::Tensor rows;       // (n) block rows
    torch::Tensor cols;       // (n, count) key blocks
  };
  const std::vector<Group>& groups() const { return groups_; }
  // For each (head, block row), row-major: its row in the groups' outputs concatenated in order, or the one after
  // them all (a zero row) when it attends to nothing.
  const torch::Tensor& placement() const { return placement_; }
  int64_t heads() const { return heads_; }
  int64_t blocks() const { return blocks_; }
  int64_t block() const { return block_; }
  bool causal() const { return causal_; }
  torch::Device device() const { return device_; }
  // (query block, key block) pairs computed: the work, and the scores' memory, are this × block².
  int64_t scored_blocks() const { return scored_blocks_; }

 private:
  std::vector<Group> groups_;
  torch::Tensor placement_;
  int64_t heads_ = 0, blocks_ = 0, block_ = 0, scored_blocks_ = 0;
  bool causal_ = false;
  torch::Device device_ = torch::kCPU;
};

// q, k, v (B, H, T, D) with T = plan.blocks() · plan.block(); masks.causal must be the plan's. Returns (B, H, T, D).
// A row whose blocks are all masked gives NaN, as a dense softmax over -inf does; a row with no block in the layout
// (under causal: none at or before its diagonal) gives zeros. std::invalid_argument naming the shapes when they disagree.
torch::Tensor block_sparse_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const BlockSparsePlan& plan, const AttentionMasks& masks = {});
// The same with a plan made for this call: layout (H, T/block, T/block).
torch::Tensor block_sparse_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& layout, int64_t block, const AttentionMasks& masks = {});

// The same attention computed densely: the (T, T) scores with everything outside the layout at -inf. The reference
// the tests hold the block-sparse one to, and the dense baseline of bench/long_context.
torch::Tensor masked_dense_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const torch::Tensor& layout, int64_t block, const AttentionMasks& masks = {});

}  // namespace dscpp::sparse_attention
