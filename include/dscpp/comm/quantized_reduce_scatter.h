// Quantized reduce-scatter: ZeRO++'s qgZ (DeepSpeed's zero_quantized_gradients). Instead of a reduce-scatter of
// 16-bit gradients, each rank quantizes every other rank's chunk of its gradient buffer to 4-bit blocks
// (block_quantizer.h, kGradientQuantBlock) and sends it with an all-to-all; the chunk's owner dequantizes what every
// rank sent and sums in fp32. A rank sends ½ byte per element (plus a scale per block) where a bf16 reduce-scatter sends 2: about a
// quarter of the gradient traffic.
//
// With `local` (the hpZ group: consecutive ranks, typically one node) the reduction is hierarchical, as DeepSpeed's
// all_to_all_quant_reduce: an all-to-all inside the group brings to each member the chunks of every rank that has
// its position in some group, from all its group's members; it sums them, quantizes the sums again and an all-to-all
// among the ranks of its position (`across`, one per group) brings each chunk to its owner, which sums those. Only
// 1/|local| of the buffer then crosses between groups.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "dscpp/comm/block_quantizer.h"  // kGradientQuantBlock
#include "dscpp/comm/comm.h"

namespace dscpp {

// `input` (world_size equal chunks, any floating dtype, contiguous): `output` (input.numel() / world_size, any floating
// dtype) receives the sum over `comm`'s ranks of their chunk `comm.rank()`, through 4-bit blocks. `local` and
// `across` (both or neither): `comm` split into groups of consecutive ranks and into the ranks of one position in
// them; then |local| × |across| = |comm|. Collective over `comm` (and the splits); wait() on the handle finishes the
// sum. std::invalid_argument for sizes that do not fit.
Handle quantized_reduce_scatter(Comm& comm, torch::Tensor& output, const torch::Tensor& input, Comm* local = nullptr,
                                Comm* across = nullptr);

}  // namespace dscpp
