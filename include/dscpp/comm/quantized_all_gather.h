// Quantized all-gather: ZeRO++'s qwZ (DeepSpeed's zero_quantized_weights). Each rank sends its shard as int8 blocks
// with one fp32 scale per block of up to 4,096 elements (block_quantizer.h) instead of its 16- or 32-bit values, and
// every rank dequantizes what arrives, so the weights' all-gather moves about half the bytes of a bf16 one (a quarter
// of an fp32 one). Every rank, its own shard included, ends with the same dequantized values, so the ranks' forwards
// agree.
#pragma once

#include <torch/torch.h>

#include "dscpp/comm/block_quantizer.h"
#include "dscpp/comm/comm.h"

namespace dscpp {

// `output` (world × shard.numel() elements, contiguous) receives every rank's shard, in rank order, quantized by its
// sender and dequantized here. Collective over `comm`; the returned handle's wait() finishes the dequantization.
// std::invalid_argument for an output of another size.
Handle quantized_all_gather(Comm& comm, torch::Tensor& output, const torch::Tensor& shard);
// The same from a shard already quantized (8 bits, quantize_blocks) of `shard_numel` elements: what ZeRO++'s
// zero_quantized_nontrainable_weights keeps instead of the frozen parameters' shards.
Handle quantized_all_gather(Comm& comm, torch::Tensor& output, const QuantizedBlocks& shard, int64_t shard_numel);

}  // namespace dscpp
