// Block-sparse attention layouts, DeepSpeed's SparsityConfig family (deepspeed/ops/sparse_attention/
// sparsity_config.py of the releases that had it): which (query block, key block) pairs of a sequence's attention
// each head computes. A layout is an int64 tensor (heads, blocks, blocks) of 0/1, blocks = seq_len / block, built by
// the same rules in the same order as DeepSpeed's classes — random blocks included, drawn through a sampler with
// Python's random.sample semantics (python_random.h, or Python's own `random` from the Python front end) — so the
// same config and seed give DeepSpeed's tensor. The modes and their parameters: dscpp/config/sparse_attention.h.
// Unidirectional layouts keep the block diagonal whole: a model masks within it (causal attention).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "dscpp/config/sparse_attention.h"

namespace dscpp::sparse_attention {

using dscpp::SparsityConfig;

// random.sample(range(n), k).
using BlockSampler = std::function<std::vector<int64_t>(int64_t n, int64_t k)>;

// The (num_heads, seq_len / block, seq_len / block) int64 layout. std::invalid_argument when seq_len does not divide
// into blocks or the blocks are fewer than a window / random / global count needs (DeepSpeed's checks). `sample` is
// called only by the layouts with random blocks (variable, bigbird), row by row, head by head.
torch::Tensor make_layout(const SparsityConfig& config, int64_t seq_len, const BlockSampler& sample = {});

}  // namespace dscpp::sparse_attention
