// A tensor-parallel linear layer's place in its whole layer, for DeepSpeed Compression that equals the whole layer's:
// gpt-train's --compression with --tensor_parallel computes on each rank exactly its slice of what one process
// computes — the same quantization groups and scales, the same top-k masks, the same activation ranges — so a run
// at any tensor-parallel size gives the one-process run's losses. (Python's mpu layers instead compress each
// partition on its own, as DeepSpeed's ColumnParallelLinear_Compress does: python/dscpp/compression/parallel_layer.py.)
//
// Masks and learned scores stay whole on every rank — the same values everywhere, kept under the one-process names,
// so checkpoints move between layouts — and a forward takes this rank's part of them; a learned score's gradient is
// summed over the group, each rank having seen only its slice's share of it.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>

#include "dscpp/checkpoint/tensor_slice.h"
#include "dscpp/comm/comm.h"

namespace dscpp::compression {

struct LayerPartition {
  LayerPartition(std::shared_ptr<Comm> group, TensorSlice weight) : group(std::move(group)), weight(std::move(weight)) {}

  std::shared_ptr<Comm> group;  // the model-parallel group
  TensorSlice weight;           // this rank's slice of the whole (out, in) weight

  // Row-parallel: the input arrives split over its features, as the weight's columns are.
  bool input_split() const { return weight.dim == 1; }

  // The whole weight, assembled from every rank's slice (collective; a copy, outside autograd). Where each rank's
  // elements sit in the whole is gathered on the first call and kept (a forward that quantizes the whole calls this).
  torch::Tensor whole(const torch::Tensor& local) const;

  // This rank's part of `t`, a tensor broadcastable to the whole weight — a mask (out, in), a row mask (out, 1), a
  // column mask (1, in): its pieces along the sliced dimension, or `t` as it is where that dimension is 1.
  // Differentiable (a slice).
  torch::Tensor local(const torch::Tensor& t) const;

  // Learned scores as every rank computes with them: the identity forward, the gradient summed over the group.
  torch::Tensor shared(const torch::Tensor& scores) const;

  // Whether each of the whole weight's `groups` quantization groups (equal runs of its flattened elements) lies
  // within one rank's slice; then this rank's slice holds `local_groups` of them, in order, and quantizing the slice
  // on its own gives the whole's values. `groups` must divide the whole's elements.
  bool groups_aligned(int64_t groups) const;
  int64_t local_groups(int64_t groups) const { return groups * weight.numel() / weight.whole_numel(); }
  // Whether `mine` holds on every rank of the group (collective): a choice that decides whether a forward
  // communicates must be the same on all of them.
  bool all(bool mine) const;

  // [min, max] of each token's whole feature vector, (tokens, 2), for an input split over its features (a row-
  // parallel layer's); of the whole input, (2), with `per_token` false. Collective; outside autograd.
  torch::Tensor input_range(const torch::Tensor& x, bool per_token) const;

 private:
  mutable torch::Tensor places_;  // whole()'s: every rank's elements' flat indices in the whole, rank-major
};

}  // namespace dscpp::compression
