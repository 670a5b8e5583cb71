// Quantized reduce-scatter (quantized_reduce_scatter.h gives the algorithm).
#include "dscpp/comm/quantized_reduce_scatter.h"

#include <stdexcept>
#include <string>

#include "dscpp/comm/block_quantizer.h"

namespace dscpp {
namespace {

// One all-to-all of 4-bit rows: `rows` (comm.world_size() × k rows of equal, block-aligned length) quantized row by
// row; rows [j·k, (j+1)·k) go to rank j, and `received` gets every rank's k rows for this rank, rank-major.
struct RowExchange {
  QuantizedBlocks sent, received;
  Handle values, scales;

  RowExchange(Comm& comm, const torch::Tensor& rows, int64_t block_numel) {
    sent = quantize_blocks(rows, 4, block_numel);  // rows are whole blocks, so no block spans two rows
    received.bits = 4;
    received.values = torch::empty_like(sent.values);
    received.scales = torch::empty_like(sent.scales);
    values = comm.all_to_all(received.values, sent.values);
    scales = comm.all_to_all(received.scales, sent.scales);
  }
  // The received rows, fp32, (rows, row length).
  torch::Tensor wait(int64_t row_numel) {
    values.wait();
    scales.wait();
    return dequantized(received).view({-1, row_numel});
  }
};

}  // namespace

Handle quantized_reduce_scatter(Comm& comm, torch::Tensor& output, const torch::Tensor& input, Comm* local,
                                Comm* across) {
  const int64_t world = comm.world_size();
  const int64_t chunk = input.numel() / world;
  if (input.numel() % world != 0 || output.numel() != chunk || !input.is_contiguous()) {
    throw std::invalid_argument("quantized_reduce_scatter: an input of " + std::to_string(input.numel()) +
                                " elements over " + std::to_string(world) + " ranks into an output of " +
                                std::to_string(output.numel()) + " (the input must be contiguous, in equal chunks)");
  }
  if ((local == nullptr) != (across == nullptr) ||
      (local != nullptr && int64_t{local->world_size()} * across->world_size() != world)) {
    throw std::invalid_argument("quantized_reduce_scatter: the local and across groups must both be given and make " +
                                std::to_string(world) + " ranks together");
  }
  // Each chunk padded to whole blocks, so that every block belongs to one destination.
  const auto layout = quantization_blocks(std::max<int64_t>(chunk, 1), kGradientQuantBlock);
  const int64_t padded = layout.padded_numel();
  auto rows = torch::zeros({world, padded}, input.options().dtype(torch::kFloat32));
  rows.narrow(1, 0, chunk).copy_(input.view({world, chunk}));
  auto out = output.view({-1});

  if (local == nullptr || local->world_size() == 1 || across->world_size() == 1) {
    auto exchange = std::make_shared<RowExchange>(comm, rows, layout.block_numel);
    return Handle([exchange, out, padded, chunk]() mutable {
      out.copy_(exchange->wait(padded).sum(0).narrow(0, 0, chunk));
    });
  }
  // Rank n·L + l is member l of group n. Member j of this rank's group gets, for every group m, the chunk of rank
  // m·L + j: the rows (m, j) of the input seen as (groups, L, padded), sent as (L, groups, padded).
  const int64_t members = local->world_size(), groups = across->world_size();
  auto by_member = rows.view({groups, members, padded}).transpose(0, 1).contiguous().view({-1, padded});
  auto first = std::make_shared<RowExchange>(*local, by_member, layout.block_numel);
  Comm* second_comm = across;
  const int64_t block_numel = layout.block_numel;
  return Handle([first, second_comm, out, padded, chunk, members, groups, block_numel]() mutable {
    // This group's sums of the chunks of every rank at this rank's position, one row per group, then to their owners.
    const auto group_sums = first->wait(padded).view({members, groups, padded}).sum(0);
    RowExchange second(*second_comm, group_sums, block_numel);
    out.copy_(second.wait(padded).sum(0).narrow(0, 0, chunk));
  });
}

}  // namespace dscpp
