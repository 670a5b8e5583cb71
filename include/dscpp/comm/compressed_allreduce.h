// Error-compensated 1-bit all-reduce: the communication of DeepSpeed's 1-bit Adam, 0/1 Adam and 1-bit LAMB
// (deepspeed/runtime/comm/nccl.py, compressed_allreduce). It averages a buffer over the ranks sending one bit per
// element and a few fp32 scales, instead of 32 bits per element, and keeps what the compression lost as error
// feedback that the next call adds back, so that the errors do not accumulate over steps.
//
// One call, on every rank (the buffer padded to `padded` elements, `chunk` = padded / world of them owned per rank):
//   worker: m = buffer + worker error; scale_w = ‖m‖ / √padded; the signs of m (≥ 0 → +1, < 0 → −1) packed 8 to a
//           byte; worker error = m − scale_w · sign(m).
//   phase 1: all_to_all of the packed signs (rank r receives every rank's signs of chunk r), all_gather of scale_w.
//   server (chunk r): c = Σ_ranks sign · scale_w / world + server error; scale_s = ‖c‖ / √chunk; server error =
//           c − scale_s · sign(c).
//   phase 2: all_gather of every chunk's packed signs and scale_s; buffer = scale_s · sign, chunk by chunk.
// On the wire a rank sends padded/8 bytes of signs twice and two floats per rank: 1/32 of an fp32 all-reduce's
// payload (the comms logger counts the all_to_all and the all_gathers at their byte sizes).
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "dscpp/comm/comm.h"

namespace dscpp {

// The error feedback one rank keeps between calls for one buffer (zeros at the start; checkpointed by the optimizers
// that use it). fp32, on the buffer's device.
struct CompressionErrors {
  torch::Tensor worker;  // (padded): what this rank's compression of the whole buffer lost
  torch::Tensor server;  // (padded / world): what this rank's compression of the chunk it owns lost

  // Zeros for a buffer of `numel` elements over `world_size` ranks.
  static CompressionErrors zeros(int64_t numel, int world_size, const torch::TensorOptions& options);
};

// `numel` rounded up as DeepSpeed pads it: a multiple of world_size × lcm(world_size, 8), so that every rank owns a
// whole number of bytes of signs (8 × world_size where the world size divides 8).
int64_t compressed_padded_numel(int64_t numel, int world_size);

// Replaces `buffer` (fp32, contiguous, any shape) by the compressed average over `comm`'s ranks, updating `errors`
// (made by CompressionErrors::zeros for this buffer and comm). Collective: every rank calls it with a buffer of the
// same size. std::invalid_argument naming the mismatch for a buffer that is not fp32 or errors of the wrong size.
void compressed_all_reduce(Comm& comm, torch::Tensor& buffer, CompressionErrors& errors);

// The signs of `values` (≥ 0 → 1), 8 to a byte, the first element in the highest bit (numpy's packbits order);
// values.numel() a multiple of 8. unpack_signs gives them back as ±1 floats.
torch::Tensor pack_signs(const torch::Tensor& values);
torch::Tensor unpack_signs(const torch::Tensor& packed);

}  // namespace dscpp
