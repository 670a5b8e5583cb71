// Block quantization for ZeRO++'s compressed collectives: DeepSpeed's symmetric quantizer
// (csrc/includes/quantization_utils.h, Type::Symmetric) on equal blocks of a flat buffer, 8 bits for the weights'
// all-gather (qwZ, quantized_all_gather.h) and 4 bits for the gradients' reduce-scatter (qgZ,
// quantized_reduce_scatter.h).
//
// Per block, with m the block's largest |x| and b the bits: q = clamp(round_half_even(x · 2^b / (2m)), −2^(b−1),
// 2^(b−1) − 1), and the scale kept is 2m / 2^b (1 for a block of zeros); the value back is q · scale. Blocks are equal,
// at most `target` elements each (rounded up to a multiple of 8), the buffer padded with zeros to fill them. DeepSpeed's
// CUDAQuantizer aims at the same ~4K but only by dividing the buffer exactly, which for a buffer of 8 × a prime falls
// to blocks of 8 — a scale per 8 elements — so the padding here is what keeps the scales a small share of the bytes
// whatever the buffer. (DeepSpeed's kernel also rounds bf16 values to fp16 first; here they are quantized from their
// own values.)
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace dscpp {

// The block sizes of ZeRO++'s collectives: the weights' int8 blocks (qwZ; DeepSpeed's CUDAQuantizer's ~4K), and the
// gradients' 4-bit blocks (qgZ), smaller so that one large gradient flattens no more than a thousand others; a 4-byte
// scale per block adds 0.1% and 0.8% to their bytes.
constexpr int64_t kWeightQuantBlock = 4096;
constexpr int64_t kGradientQuantBlock = 1024;

// How `numel` elements are cut into blocks: the fewest of at most `target` (+7), all of block_numel elements.
struct BlockLayout {
  int64_t blocks = 0;
  int64_t block_numel = 0;  // a multiple of 8
  int64_t padded_numel() const { return blocks * block_numel; }
};
BlockLayout quantization_blocks(int64_t numel, int64_t target = kWeightQuantBlock);

struct QuantizedBlocks {
  int bits = 8;
  // 8 bits: int8, one per element. 4 bits: uint8, two per byte (q + 8, the earlier element in the low nibble).
  torch::Tensor values;  // 1-D, the blocks one after another (padded numel × bits / 8 bytes)
  torch::Tensor scales;  // fp32, (blocks): what each block's integers are multiplied by
};

// `values` (any floating dtype and shape, flattened) as blocks of `bits` (8 or 4); the padding is zeros.
QuantizedBlocks quantize_blocks(const torch::Tensor& values, int bits, int64_t target = kWeightQuantBlock);
// Writes the first out.numel() dequantized values into `out` (any floating dtype), converting to its dtype.
void dequantize_blocks(const QuantizedBlocks& blocks, torch::Tensor& out);
// All the values of the blocks (padding included), fp32.
torch::Tensor dequantized(const QuantizedBlocks& blocks);

}  // namespace dscpp
