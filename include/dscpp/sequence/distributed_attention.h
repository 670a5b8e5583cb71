// DeepSpeed-Ulysses sequence parallelism (deepspeed.sequence.layer.DistributedAttention): each rank of a
// sequence-parallel group holds a slice of every sequence. Attention needs the whole sequence, so around it one
// all-to-all per tensor swaps what is split — from the sequence to the heads before attention (each rank then
// attends over the whole sequence for its share of the heads) and back after. Everything outside attention (the
// projections, the MLP, the loss) works on the rank's own tokens. The exchanges are differentiable: each one's
// gradient is the inverse exchange.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>

#include "dscpp/comm/comm.h"

namespace dscpp {

// Over `group` (P ranks): `input` is cut into P equal chunks along `scatter_dim`; chunk j goes to rank j, and the P
// chunks this rank receives are concatenated along `gather_dim` in rank order. So [B, S/P, H, D] with scatter 2,
// gather 1 becomes [B, S, H/P, D] holding heads [r·H/P, (r+1)·H/P) of the whole sequence on rank r — DeepSpeed's
// layout exactly (its _SeqAllToAll), and the same function with the dimensions swapped undoes it, which is its
// gradient. std::invalid_argument naming the sizes when `scatter_dim`'s size does not divide by P.
torch::Tensor seq_all_to_all(const torch::Tensor& input, const std::shared_ptr<Comm>& group, int64_t scatter_dim,
                             int64_t gather_dim);

// Attention over a sequence split across `group`. `local_attention(q, k, v)` is the model's own attention on whole
// sequences (any causal mask, dropout or softmax scale is its business); it receives [B, S, H/P, D] (batch first) or
// [S, B, H/P, D] and returns a tensor of that layout. forward takes query, key and value of [B, S/P, H, D] or
// [S/P, B, H, D] (`batch_dim` 0 or 1, as DeepSpeed's batch_dim_idx) and returns the context in the input's layout,
// for this rank's tokens. Heads (dimension 2) must divide by P: an error names both numbers otherwise.
class DistributedAttention {
 public:
  using LocalAttention = std::function<torch::Tensor(const torch::Tensor& q, const torch::Tensor& k,
                                                     const torch::Tensor& v)>;

  DistributedAttention(LocalAttention local_attention, std::shared_ptr<Comm> sequence_group);

  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                        int64_t batch_dim = 0) const;

  const std::shared_ptr<Comm>& group() const { return group_; }

 private:
  LocalAttention local_attention_;
  std::shared_ptr<Comm> group_;
};

}  // namespace dscpp
