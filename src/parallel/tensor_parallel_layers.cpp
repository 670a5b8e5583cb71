// Each layer draws its whole weight as the whole layer would (a temporary torch::nn::Linear / Embedding: same
// generator calls, same values) and keeps its slice.
#include "dscpp/parallel/tensor_parallel_layers.h"

#include <limits>
#include <stdexcept>
#include <string>

#include "dscpp/parallel/tensor_parallel_ops.h"

namespace dscpp {
namespace {

int64_t share_of(int64_t n, const std::shared_ptr<Comm>& group, const std::string& what) {
  if (!group) throw std::invalid_argument(what + ": the model-parallel group is null");
  const int p = group->world_size();
  if (n % p != 0) {
    throw std::invalid_argument(what + " does not divide over the tensor-parallel size " + std::to_string(p) +
                                ": each rank holds an equal slice, so it must be a multiple of " + std::to_string(p));
  }
  return n / p;
}

}  // namespace

torch::Tensor column_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                     const std::shared_ptr<Comm>& group) {
  return torch::linear(copy_to_model_parallel(x, group), weight, bias);
}

torch::Tensor row_parallel_linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                                  const std::shared_ptr<Comm>& group) {
  if (group->world_size() == 1) return torch::linear(x, weight, bias);
  auto y = reduce_from_model_parallel(torch::linear(x, weight), group);  // the bias once, after the sum
  return bias.defined() ? y + bias : y;
}

torch::Tensor vocab_parallel_embedding(const torch::Tensor& ids, const torch::Tensor& weight, int64_t vocab_begin,
                                       const std::shared_ptr<Comm>& group) {
  if (group->world_size() == 1) return torch::embedding(weight, ids);
  const auto outside = (ids < vocab_begin) | (ids >= vocab_begin + weight.size(0));
  auto local = (ids - vocab_begin).masked_fill(outside, 0);
  auto out = torch::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_model_parallel(out, group);
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in_features, int64_t out_features,
                                                   std::shared_ptr<Comm> group, bool bias, bool gather_output)
    : group_(std::move(group)), gather_output_(gather_output) {
  const int64_t rows = share_of(out_features, group_, "ColumnParallelLinear: out_features " +
                                                          std::to_string(out_features));
  weight = register_parameter("weight", torch::empty({rows, in_features}));
  if (bias) this->bias = register_parameter("bias", torch::empty({rows}));
  torch::nn::Linear whole(torch::nn::LinearOptions(in_features, out_features).bias(bias));
  set_from_whole(whole->weight, bias ? whole->bias : torch::Tensor());
}

void ColumnParallelLinearImpl::set_from_whole(const torch::Tensor& w, const torch::Tensor& b) {
  torch::NoGradGuard no_grad;
  const int64_t rows = weight.size(0), begin = group_->rank() * rows;
  weight.copy_(w.narrow(0, begin, rows));
  if (bias.defined()) bias.copy_(b.narrow(0, begin, rows));
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  auto y = column_parallel_linear(x, weight, bias, group_);
  return gather_output_ ? gather_from_model_parallel(y, group_) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in_features, int64_t out_features, std::shared_ptr<Comm> group,
                                             bool bias, bool input_is_parallel)
    : group_(std::move(group)), input_is_parallel_(input_is_parallel) {
  const int64_t columns = share_of(in_features, group_, "RowParallelLinear: in_features " +
                                                             std::to_string(in_features));
  weight = register_parameter("weight", torch::empty({out_features, columns}));
  if (bias) this->bias = register_parameter("bias", torch::empty({out_features}));
  torch::nn::Linear whole(torch::nn::LinearOptions(in_features, out_features).bias(bias));
  set_from_whole(whole->weight, bias ? whole->bias : torch::Tensor());
}

void RowParallelLinearImpl::set_from_whole(const torch::Tensor& w, const torch::Tensor& b) {
  torch::NoGradGuard no_grad;
  const int64_t columns = weight.size(1);
  weight.copy_(w.narrow(1, group_->rank() * columns, columns));
  if (bias.defined()) bias.copy_(b);
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  return row_parallel_linear(input_is_parallel_ ? x : scatter_to_model_parallel(x, group_), weight, bias, group_);
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim,
                                                       std::shared_ptr<Comm> group)
    : group_(std::move(group)) {
  const int64_t rows = share_of(num_embeddings, group_, "VocabParallelEmbedding: the vocabulary size " +
                                                            std::to_string(num_embeddings));
  vocab_begin_ = group_->rank() * rows;
  weight = register_parameter("weight", torch::empty({rows, embedding_dim}));
  torch::nn::Embedding whole(num_embeddings, embedding_dim);
  set_from_whole(whole->weight);
}

void VocabParallelEmbeddingImpl::set_from_whole(const torch::Tensor& w) {
  torch::NoGradGuard no_grad;
  weight.copy_(w.narrow(0, vocab_begin_, weight.size(0)));
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& ids) {
  return vocab_parallel_embedding(ids, weight, vocab_begin_, group_);
}

std::map<std::string, TensorSlice> tensor_parallel_slices(torch::nn::Module& model) {
  std::map<std::string, TensorSlice> out;
  // `t` is part `group`'s rank of `parts` along `dim` of a whole tensor as large as `parts` of it.
  auto add = [&](const std::string& prefix, const torch::Tensor& t, const char* name, int64_t dim,
                 const std::shared_ptr<Comm>& group) {
    if (!t.defined() || !t.requires_grad()) return;
    auto whole = t.sizes().vec();
    whole[dim] *= group->world_size();
    out.emplace(prefix.empty() ? name : prefix + "." + name,
                TensorSlice::part(whole, dim, group->world_size(), group->rank()));
  };
  for (const auto& item : model.named_modules()) {
    const std::string& prefix = item.key();
    torch::nn::Module* m = item.value().get();
    if (auto* column = dynamic_cast<ColumnParallelLinearImpl*>(m)) {
      add(prefix, column->weight, "weight", 0, column->group());
      add(prefix, column->bias, "bias", 0, column->group());
    } else if (auto* row = dynamic_cast<RowParallelLinearImpl*>(m)) {
      add(prefix, row->weight, "weight", 1, row->group());
    } else if (auto* embedding = dynamic_cast<VocabParallelEmbeddingImpl*>(m)) {
      add(prefix, embedding->weight, "weight", 0, embedding->group());
    }
  }
  return out;
}

// Megatron's: the max, the target's logit and the sum of exponentials are each a local reduction over this rank's
// columns followed by an all-reduce over the group. The max only shifts for stability (no gradient); the other two
// go through reduce_from_model_parallel, whose identity backward gives each rank exactly its columns' share.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           const std::shared_ptr<Comm>& group, int64_t vocab_size) {
  if (logits.dim() != 2 || targets.dim() != 1 || targets.size(0) != logits.size(0)) {
    throw std::invalid_argument("vocab_parallel_cross_entropy: logits must be (N, V/p) and targets (N)");
  }
  auto x = logits.to(torch::kFloat);
  const int64_t columns = x.size(1), begin = group->rank() * columns;
  if (vocab_size > 0 && vocab_size < begin + columns) {  // padding columns: no probability
    const auto padding = torch::arange(begin, begin + columns, targets.options()) >= vocab_size;
    x = x.masked_fill(padding, -std::numeric_limits<float>::infinity());
  }
  auto max = std::get<0>(x.detach().max(1, /*keepdim=*/true)).contiguous();
  if (group->world_size() > 1) group->all_reduce(max, ReduceOp::kMax).wait();
  auto shifted = x - max;
  const auto outside = (targets < begin) | (targets >= begin + columns);
  auto local = (targets - begin).masked_fill(outside, 0);
  auto target_logit = shifted.gather(1, local.unsqueeze(1)).squeeze(1).masked_fill(outside, 0.0);
  target_logit = reduce_from_model_parallel(target_logit, group);
  auto sum_exp = reduce_from_model_parallel(shifted.exp().sum(1), group);
  return (sum_exp.log() - target_logit).mean();
}

}  // namespace dscpp
