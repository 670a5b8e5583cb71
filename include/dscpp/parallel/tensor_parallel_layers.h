// Megatron-style tensor-parallel layers (DeepSpeed's mpu): each rank of the model-parallel group holds a slice of a
// layer's weight and computes its share; the collectives of tensor_parallel_ops.h join the shares. Every layer is
// initialised as its whole counterpart would be (the whole weight drawn on each rank from the same generator, then
// sliced), so a model gives the same values at every tensor-parallel size, and set_from_whole() copies in a
// whole layer's weights (a loaded checkpoint, a reference in a test).
//
//   ColumnParallelLinear  y = x·Wᵀ + b, W split by output rows: rank r computes y's columns [r·out/p, (r+1)·out/p);
//                         gather_output all-gathers them, otherwise y stays split (for a RowParallelLinear next).
//   RowParallelLinear     W split by input columns: rank r multiplies its slice of x (input_is_parallel: x arrives
//                         split, as a ColumnParallelLinear leaves it) and the partial products are all-reduced;
//                         the bias is whole and added once, after the sum.
//   VocabParallelEmbedding  rows [r·V/p, (r+1)·V/p) of the table on rank r; a token outside them looks up zeros and
//                         the all-reduce fills it in.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <map>
#include <string>

#include "dscpp/checkpoint/tensor_slice.h"
#include "dscpp/comm/comm.h"

namespace dscpp {

// The layers' forwards over tensors a model holds itself (a model that keeps its own parameter names and slices
// them, as the GPT example does): `weight` and `bias` are this rank's slices as the layers below hold them.
// x·Wᵀ + b for W split by output rows: this rank's output columns (x is whole on every rank).
torch::Tensor column_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                     const std::shared_ptr<Comm>& group);
// x·Wᵀ + b for W split by input columns, x this rank's columns of the input: the whole output (b whole, or undefined).
torch::Tensor row_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                  const std::shared_ptr<Comm>& group);
// Rows [vocab_begin, vocab_begin + weight.size(0)) of an embedding table on this rank: the whole lookup.
torch::Tensor vocab_parallel_embedding(const torch::Tensor& ids, const torch::Tensor& weight, int64_t vocab_begin,
                                       const std::shared_ptr<Comm>& group);

class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  // std::invalid_argument naming the numbers when out_features does not divide over the group.
  ColumnParallelLinearImpl(int64_t in_features, int64_t out_features, std::shared_ptr<Comm> group, bool bias = true,
                           bool gather_output = true);
  torch::Tensor forward(const torch::Tensor& x);
  // Copies this rank's slice of a whole Linear's weight (out, in) and bias (out; undefined without one).
  void set_from_whole(const torch::Tensor& weight, const torch::Tensor& bias);

  torch::Tensor weight;  // (out / p, in)
  torch::Tensor bias;    // (out / p), or undefined

 const std::shared_ptr<Comm>& group() const { return group_; }

 private:
  std::shared_ptr<Comm> group_;
  bool gather_output_;
};
TORCH_MODULE(ColumnParallelLinear);

class RowParallelLinearImpl : public torch::nn::Module {
 public:
  // std::invalid_argument naming the numbers when in_features does not divide over the group.
  RowParallelLinearImpl(int64_t in_features, int64_t out_features, std::shared_ptr<Comm> group, bool bias = true,
                        bool input_is_parallel = false);
  torch::Tensor forward(const torch::Tensor& x);
  void set_from_whole(const torch::Tensor& weight, const torch::Tensor& bias);

  torch::Tensor weight;  // (out, in / p)
  torch::Tensor bias;    // (out), whole on every rank, or undefined

 const std::shared_ptr<Comm>& group() const { return group_; }

 private:
  std::shared_ptr<Comm> group_;
  bool input_is_parallel_;
};
TORCH_MODULE(RowParallelLinear);

class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  // std::invalid_argument naming the numbers when num_embeddings does not divide over the group. Initialised
  // N(0, 1) as torch::nn::Embedding.
  VocabParallelEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, std::shared_ptr<Comm> group);
  torch::Tensor forward(const torch::Tensor& ids);
  void set_from_whole(const torch::Tensor& weight);
  int64_t vocab_begin() const { return vocab_begin_; }  // this rank's first row

  torch::Tensor weight;  // (V / p, dim)

 const std::shared_ptr<Comm>& group() const { return group_; }

 private:
  std::shared_ptr<Comm> group_;
  int64_t vocab_begin_;
};
TORCH_MODULE(VocabParallelEmbedding);

// The trainable parameters of `model`'s tensor-parallel layers that are slices, by name (as model.named_parameters()
// gives them), and where each sits in the whole: Column's weight and bias (rows), Row's weight (columns; its bias is
// whole), the embedding's table (rows). What the engine's InitOptions::model_parallel_slices takes.
std::map<std::string, TensorSlice> tensor_parallel_slices(torch::nn::Module& model);

// Mean cross-entropy over N positions from logits split over the vocabulary — `logits` (N, V/p) are this rank's
// columns [vocab_begin, vocab_begin + V/p), as a ColumnParallelLinear without gather_output or the transposed
// VocabParallelEmbedding leave them — without any rank holding (N, V). `targets` (N) int64 are whole-vocabulary
// ids. Computed in fp32; the same loss on every rank of the group, whose backward gives each rank its columns'
// gradient (softmax − one-hot). `vocab_size` (when > 0) is the vocabulary the targets use: the columns past it are
// padding (a vocabulary rounded up to divide over the ranks) and get no probability.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           const std::shared_ptr<Comm>& group, int64_t vocab_size = 0);

}  // namespace dscpp
