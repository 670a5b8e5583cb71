// A tensor-parallel layer's compression as its whole layer's: the whole weight assembled once where a mask needs it,
// the masks' parts taken per forward, the quantization groups checked against the slice, the input's range reduced
// over the group.
#include "dscpp/compression/layer_partition.h"

#include <algorithm>
#include <numeric>

#include "dscpp/parallel/tensor_parallel_ops.h"

namespace dscpp::compression {

torch::Tensor LayerPartition::whole(const torch::Tensor& local) const {
  torch::NoGradGuard no_grad;
  const int p = group->world_size();
  if (!places_.defined() || places_.device() != local.device()) {
    // Each rank's elements' places in the whole (flat indices), gathered once; every rank's slice has the same
    // size, so the value gathers line up with them rank by rank.
    const auto mine = weight.take(torch::arange(weight.whole_numel(),
                                                torch::TensorOptions().dtype(torch::kLong).device(local.device()))
                                      .view(weight.whole_shape))
                          .view(-1);
    places_ = torch::empty({p * mine.numel()}, mine.options());
    group->all_gather(places_, mine).wait();
  }
  auto values = torch::empty({p * local.numel()}, local.options());
  group->all_gather(values, local.contiguous().view(-1)).wait();
  auto out = torch::empty({weight.whole_numel()}, local.options());
  out.index_put_({places_}, values);
  return out.view(weight.whole_shape);
}

torch::Tensor LayerPartition::local(const torch::Tensor& t) const {
  if (t.size(weight.dim) == 1) return t;
  TensorSlice part = weight;
  part.whole_shape = t.sizes().vec();
  return part.take(t);
}

torch::Tensor LayerPartition::shared(const torch::Tensor& scores) const {
  return copy_to_model_parallel(scores, group);
}

bool LayerPartition::groups_aligned(int64_t groups) const {
  // The slice is, in flat order, runs of the whole's elements: for each index of the dimensions before `dim`, each
  // piece's [begin, begin + length) times the elements after `dim`. Groups of S elements lie within runs exactly
  // when S divides every run's start and length (and the stride between outer indices).
  int64_t inner = 1;
  for (size_t d = weight.dim + 1; d < weight.whole_shape.size(); ++d) inner *= weight.whole_shape[d];
  int64_t g = weight.whole_shape[weight.dim] * inner;
  for (const auto& [begin, length] : weight.pieces) g = std::gcd(g, std::gcd(begin * inner, length * inner));
  const int64_t size = weight.whole_numel() / groups;
  return g % size == 0;
}

bool LayerPartition::all(bool mine) const {
  const auto flags = group->side_all_gather({mine ? 1 : 0});  // a flag, not data: no device tensor needed
  return std::all_of(flags.begin(), flags.end(), [](int64_t flag) { return flag == 1; });
}

torch::Tensor LayerPartition::input_range(const torch::Tensor& x, bool per_token) const {
  torch::NoGradGuard no_grad;
  const torch::Tensor lo = per_token ? x.amin(-1).reshape(-1) : x.min().view(1);
  const torch::Tensor hi = per_token ? x.amax(-1).reshape(-1) : x.max().view(1);
  // One all-reduce for both: the maximum of −min is −(the minimum). In fp32 whatever x's dtype (exact: x's values).
  auto packed = torch::stack({-lo, hi}, 1).to(torch::kFloat32).contiguous();
  group->all_reduce(packed, ReduceOp::kMax).wait();
  const auto range = torch::stack({-packed.select(1, 0), packed.select(1, 1)}, 1).to(x.scalar_type());
  return per_token ? range : range.view(2);
}

}  // namespace dscpp::compression
