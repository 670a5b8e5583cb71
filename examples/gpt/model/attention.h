// Causal multi-head self-attention with GPT-2's fused q/k/v projection (HF GPT2Attention layout).
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>

#include "dscpp/comm/comm.h"
#include "dscpp/compression/linear_compression.h"
#include "dscpp/sparse_attention/block_sparse_attention.h"
#include "model/gpt_config.h"
#include "model/kv_cache.h"

namespace gpt {

// dropout(softmax(q·kᵀ/√d + causal mask), dropout_p)·v for (B, nh, T, hs) tensors: without dropout
// at::scaled_dot_product_attention (the fused kernel where the device has one), with it the same math spelled out.
// The heads may be part `head_part` of `head_parts` of a tensor-parallel attention: its dropout then draws the mask
// of every head, as the whole model's dropout would from the same generator state, and keeps its own heads' — so
// each rank drops what a single process drops, and every rank's generator stays in step with the others'.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               double dropout_p = 0.0, int head_parts = 1, int head_part = 0);

// Tensor parallel over `group` (p ranks; a group of one is the whole layer): rank r holds heads [r·nh/p, (r+1)·nh/p)
// — rows of q, k and v each in c_attn (Megatron's column-parallel projection), the matching columns of c_proj
// (row-parallel, its bias whole) — and the two projections communicate once each way.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& config, std::shared_ptr<dscpp::Comm> group = nullptr);

  // x: (B, T, C) → (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);
  // Generation: while `cache` is set, a forward takes x as the positions after the cached ones, appends their keys
  // and values to it and attends as cache->allowed says (null: the plain causal forward). Not with sequence
  // parallelism or sparse attention (std::invalid_argument).
  void set_cache(AttentionCache* cache) { cache_ = cache; }
  // Keeps this rank's heads of the whole, initialised weights (called once, right after initialisation).
  void keep_own_heads();
  // DeepSpeed-Ulysses over `group` (P ranks, null or one rank: off): x holds this rank's T/P positions of each
  // sequence, and attention runs over whole sequences for n_head/P heads between dscpp::DistributedAttention's
  // all-to-alls. The weights are whole on every rank.
  void set_sequence_group(std::shared_ptr<dscpp::Comm> group) { sequence_group_ = std::move(group); }
  // Block-sparse attention (DeepSpeed's sparse_attention): `layout` (this rank's heads, blocks, blocks) for the
  // longest sequence, of `block`-position blocks; a shorter sequence uses its top-left corner, as DeepSpeed's
  // SparseSelfAttention does. Causal within the layout. An undefined layout: dense attention.
  void set_sparse_layout(torch::Tensor layout, int64_t block) {
    sparse_layout_ = std::move(layout);
    sparse_block_ = block;
    sparse_plans_.clear();
  }

  torch::nn::Linear c_attn{nullptr};  // (3C/p, C) weight: this rank's q, k, v rows stacked along the output dim
  torch::nn::Linear c_proj{nullptr};  // (C, C/p)
  // DeepSpeed Compression of the two projections (gpt-train with compression_training; null: none).
  std::shared_ptr<dscpp::compression::LinearCompression> c_attn_compression, c_proj_compression;

 private:
  int64_t n_head_;
  double dropout_;
  std::shared_ptr<dscpp::Comm> group_;
  std::shared_ptr<dscpp::Comm> sequence_group_;
  torch::Tensor sparse_layout_;
  int64_t sparse_block_ = 0;
  std::map<int64_t, dscpp::sparse_attention::BlockSparsePlan> sparse_plans_;  // per sequence length
  AttentionCache* cache_ = nullptr;  // generation's (set_cache)
};
TORCH_MODULE(CausalSelfAttention);

}  // namespace gpt
