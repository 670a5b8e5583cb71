// Quantized all-gather (quantized_all_gather.h).
#include "dscpp/comm/quantized_all_gather.h"

#include <stdexcept>
#include <string>

#include "dscpp/comm/block_quantizer.h"

namespace dscpp {

Handle quantized_all_gather(Comm& comm, torch::Tensor& output, const torch::Tensor& shard) {
  return quantized_all_gather(comm, output, quantize_blocks(shard, 8), shard.numel());
}

Handle quantized_all_gather(Comm& comm, torch::Tensor& output, const QuantizedBlocks& mine, int64_t shard_numel) {
  const int world = comm.world_size();
  if (output.numel() != world * shard_numel || !output.is_contiguous()) {
    throw std::invalid_argument("quantized_all_gather: the output has " + std::to_string(output.numel()) +
                                " elements for " + std::to_string(world) + " shards of " +
                                std::to_string(shard_numel) + " (it must be contiguous and hold exactly them)");
  }
  const int64_t padded = mine.values.numel(), blocks = mine.scales.numel();
  auto values = torch::empty({world * padded}, mine.values.options());
  auto scales = torch::empty({world * blocks}, mine.scales.options());
  Handle gather_values = comm.all_gather(values, mine.values);
  Handle gather_scales = comm.all_gather(scales, mine.scales);
  auto flat = output.view({-1});
  // The inputs stay alive until the gathers are waited for (a collective may still be reading them).
  return Handle([=, sent = mine]() mutable {
    gather_values.wait();
    gather_scales.wait();
    for (int r = 0; r < world; ++r) {
      auto part = flat.narrow(0, r * shard_numel, shard_numel);
      dequantize_blocks({8, values.narrow(0, r * padded, padded), scales.narrow(0, r * blocks, blocks)}, part);
    }
  });
}

}  // namespace dscpp
