// Causal self-attention: fused qkv projection, split into heads, masked softmax, output projection.
#include "model/attention.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "dscpp/parallel/tensor_parallel_layers.h"
#include "dscpp/sequence/distributed_attention.h"
#include "dscpp/sparse_attention/block_sparse_attention.h"
#include "model/dropout.h"

namespace gpt {

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               double dropout_p, int head_parts, int head_part) {
  if (dropout_p == 0) return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, 0.0, /*is_causal=*/true);
  // With dropout the math is spelled out: the fused kernel draws its mask its own way, and a tensor-parallel part
  // must draw the whole model's mask and keep its heads' (dropout.h) to drop what one process drops.
  const int64_t T = q.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = torch::matmul(q, k.transpose(-2, -1)) * scale;  // (B, nh, T, T)
  // True above the diagonal: position t may not look at t' > t.
  const auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  const auto weights = dropout(torch::softmax(scores, -1), dropout_p, head_parts, head_part);  // (B, nh, T, T)
  return torch::matmul(weights, v);  // (B, nh, T, hs)
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& config, std::shared_ptr<dscpp::Comm> group)
    : n_head_(config.n_head),
      dropout_(config.dropout),
      group_(group ? std::move(group) : dscpp::make_single_process_comm()) {
  c_attn = register_module("c_attn", torch::nn::Linear(config.n_embd, 3 * config.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(config.n_embd, config.n_embd));
}

void CausalSelfAttentionImpl::keep_own_heads() {
  const int p = group_->world_size(), r = group_->rank();
  if (p == 1) return;
  const int64_t C = c_proj->weight.size(0);
  torch::NoGradGuard no_grad;
  // c_attn's rows are [q; k; v], C each: rank r keeps rows [r·C/p, (r+1)·C/p) of each.
  c_attn->weight.set_data(c_attn->weight.view({3, C, C}).chunk(p, 1)[r].reshape({3 * C / p, C}).clone());
  c_attn->bias.set_data(c_attn->bias.view({3, C}).chunk(p, 1)[r].reshape({3 * C / p}).clone());
  c_proj->weight.set_data(c_proj->weight.chunk(p, 1)[r].clone());
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  const int64_t C = c_attn->weight.size(0) / 3, heads = n_head_ / group_->world_size();  // this rank's share
  const auto in = dscpp::compression::compressed_linear(c_attn_compression, x, c_attn);
  const auto qkv = dscpp::column_parallel_linear(in.input, in.weight, in.bias, group_).split(C, /*dim=*/2);
  const auto to_heads = [&](const torch::Tensor& t) {
    return t.view({B, T, heads, C / heads}).transpose(1, 2);  // (B, nh, T, hs)
  };
  const double p = is_training() ? dropout_ : 0.0;
  torch::Tensor y;  // (B, T, nh, hs)
  if (cache_) {
    if ((sequence_group_ && sequence_group_->world_size() > 1) || sparse_layout_.defined()) {
      throw std::invalid_argument("generation with sequence parallelism or sparse attention is not supported yet");
    }
    auto k = to_heads(qkv[1]), v = to_heads(qkv[2]);
    if (cache_->keys.defined()) {
      k = torch::cat({cache_->keys, k}, 2);
      v = torch::cat({cache_->values, v}, 2);
    }
    cache_->keys = k;
    cache_->values = v;
    y = at::scaled_dot_product_attention(to_heads(qkv[0]), k, v, cache_->allowed).transpose(1, 2);
  } else if (sequence_group_ && sequence_group_->world_size() > 1) {
    // (B, T/P, nh, hs) here; (B, T, nh/P, hs) inside, where causal_attention sees whole sequences — and, with
    // dropout, draws the whole model's mask and keeps this rank's heads, as a tensor-parallel part does.
    const auto split_heads = [&](const torch::Tensor& t) { return t.view({B, T, heads, C / heads}); };
    const int parts = sequence_group_->world_size(), part = sequence_group_->rank();
    const dscpp::DistributedAttention attention(
        [p, parts, part](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
          return causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), p, parts, part)
              .transpose(1, 2);
        },
        sequence_group_);
    y = attention.forward(split_heads(qkv[0]), split_heads(qkv[1]), split_heads(qkv[2]));
  } else if (sparse_layout_.defined()) {  // only the layout's blocks (GptImpl::set_sparse_attention refuses dropout)
    if (T % sparse_block_ != 0) {
      throw std::invalid_argument("sparse_attention: the sequence length " + std::to_string(T) +
                                  " must be divisible by the block size " + std::to_string(sparse_block_));
    }
    auto plan = sparse_plans_.find(T);
    if (plan == sparse_plans_.end()) {  // the top-left corner of the layout, made ready once per length
      using torch::indexing::Slice;
      const int64_t blocks = T / sparse_block_;
      plan = sparse_plans_
                 .emplace(T, dscpp::sparse_attention::BlockSparsePlan(
                                 sparse_layout_.index({Slice(), Slice(0, blocks), Slice(0, blocks)}), sparse_block_,
                                 /*causal=*/true, x.device()))
                 .first;
    }
    dscpp::sparse_attention::AttentionMasks causal;
    causal.causal = true;
    y = dscpp::sparse_attention::block_sparse_attention(to_heads(qkv[0]), to_heads(qkv[1]), to_heads(qkv[2]),
                                                        plan->second, causal)
            .transpose(1, 2);
  } else {
    y = causal_attention(to_heads(qkv[0]), to_heads(qkv[1]), to_heads(qkv[2]), p, group_->world_size(),
                         group_->rank())
            .transpose(1, 2);
  }
  const auto proj = dscpp::compression::compressed_linear(c_proj_compression, y.contiguous().view({B, T, C}), c_proj);
  auto out = dscpp::row_parallel_linear(proj.input, proj.weight, proj.bias, group_);
  return p > 0 ? dropout(out, p, sequence_group_) : out;
}

}  // namespace gpt
