// Block quantization (block_quantizer.h gives the format).
#include "dscpp/comm/block_quantizer.h"

#include <stdexcept>
#include <string>

namespace dscpp {

BlockLayout quantization_blocks(int64_t numel, int64_t target) {
  if (numel <= 0 || target <= 0) {
    throw std::invalid_argument("quantization_blocks: " + std::to_string(numel) + " elements in blocks of " +
                                std::to_string(target) + ": both must be positive");
  }
  BlockLayout layout;
  layout.blocks = (numel + target - 1) / target;
  const int64_t per_block = (numel + layout.blocks - 1) / layout.blocks;
  layout.block_numel = (per_block + 7) / 8 * 8;
  return layout;
}

QuantizedBlocks quantize_blocks(const torch::Tensor& values, int bits, int64_t target) {
  if (bits != 8 && bits != 4) throw std::invalid_argument("quantize_blocks: " + std::to_string(bits) + " bits (8 or 4)");
  const int64_t numel = values.numel();
  const auto layout = quantization_blocks(std::max<int64_t>(numel, 1), target);
  auto x = torch::zeros({layout.padded_numel()}, values.options().dtype(torch::kFloat32));
  x.narrow(0, 0, numel).copy_(values.reshape({-1}));
  const auto blocks = x.view({layout.blocks, layout.block_numel});
  const auto max = blocks.abs().amax(1, /*keepdim=*/true);
  // fp32 as the kernel computes it: scale = 2^bits / (2 · max), and a block of zeros keeps scale 1.
  const float levels = static_cast<float>(1 << bits);
  const auto scale = torch::where(max.eq(0), torch::ones_like(max), levels / (2.0f * max));
  const double low = -(1 << (bits - 1)), high = (1 << (bits - 1)) - 1;
  auto q = blocks.mul(scale).round().clamp_(low, high).reshape({-1});
  QuantizedBlocks out;
  out.bits = bits;
  out.scales = scale.reciprocal().reshape({-1});
  if (bits == 8) {
    out.values = q.to(torch::kInt8);
  } else {
    const auto nibbles = q.add(8).to(torch::kUInt8).view({-1, 2});
    out.values = nibbles.select(1, 0).bitwise_or(nibbles.select(1, 1).bitwise_left_shift(4));
  }
  return out;
}

torch::Tensor dequantized(const QuantizedBlocks& blocks) {
  const int64_t n = blocks.scales.numel();
  torch::Tensor q;
  if (blocks.bits == 8) {
    q = blocks.values.to(torch::kFloat32);
  } else {
    const auto low = blocks.values.bitwise_and(15), high = blocks.values.bitwise_right_shift(4);
    q = torch::stack({low, high}, 1).reshape({-1}).to(torch::kFloat32).sub_(8);
  }
  if (n == 0 || q.numel() % n != 0) {
    throw std::invalid_argument("dequantize_blocks: " + std::to_string(q.numel()) + " values do not make " +
                                std::to_string(n) + " equal blocks");
  }
  return q.view({n, -1}).mul_(blocks.scales.view({n, 1})).view({-1});
}

void dequantize_blocks(const QuantizedBlocks& blocks, torch::Tensor& out) {
  const auto values = dequantized(blocks);
  if (out.numel() > values.numel()) {
    throw std::invalid_argument("dequantize_blocks: " + std::to_string(values.numel()) + " values cannot fill " +
                                std::to_string(out.numel()) + " elements");
  }
  out.view({-1}).copy_(values.narrow(0, 0, out.numel()));
}

}  // namespace dscpp
