// Error-compensated 1-bit all-reduce (compressed_allreduce.h gives the algorithm).
#include "dscpp/comm/compressed_allreduce.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>

#include "comm_errors.h"

namespace dscpp {
namespace {

// Bit weights of one packed byte, the first element in the highest bit: 128, 64, …, 1, made on `device` itself (a
// host tensor copied over would be a synchronizing copy per pack on a GPU).
torch::Tensor bit_weights(const torch::Device& device) {
  const auto shifts = torch::arange(7, -1, -1, torch::TensorOptions().dtype(torch::kInt32).device(device));
  return torch::ones_like(shifts).bitwise_left_shift(shifts).to(torch::kUInt8);
}

// √(mean of squares): the scale that keeps a sign vector's norm equal to the values'.
torch::Tensor rms_scale(const torch::Tensor& values) {
  return (values.norm() / std::sqrt(static_cast<double>(values.numel()))).reshape({1});
}

// On the host the passes over the whole buffer run as plain loops rather than tensor expressions, which make a bool-,
// a byte- and a float-per-element temporary each: at a model's size those are fresh pages every step (47k page
// faults a step in bench/compressed_comm before). The same bits: a sign is one comparison either way and ±scale is
// exact; only the server's sum over ranks may round differently from torch's reduction.

// The signs of values[0, n) packed into `packed`, and each value then less its compressed self: v −= ±scale (the
// error left after compression).
void pack_signs_and_subtract(float* values, int64_t n, float scale, uint8_t* packed) {
  for (int64_t byte = 0; byte < n / 8; ++byte) {
    float* v = values + 8 * byte;
    uint8_t bits = 0;
    for (int k = 0; k < 8; ++k) {
      const bool positive = v[k] >= 0.0f;
      bits |= static_cast<uint8_t>(positive) << (7 - k);
      v[k] -= positive ? scale : -scale;
    }
    packed[byte] = bits;
  }
}

// out[j] (op)= ±scale for the n signs in `packed`: `accumulate` adds, otherwise assigns.
void unpack_scaled(const uint8_t* packed, int64_t n, float scale, float* out, bool accumulate) {
  for (int64_t j = 0; j < n; ++j) {
    const float value = (packed[j / 8] >> (7 - j % 8)) & 1 ? scale : -scale;
    out[j] = accumulate ? out[j] + value : value;
  }
}

// The signs of `values` packed (a new tensor), and `values` replaced by what compressing them lost.
torch::Tensor compress_in_place(torch::Tensor& values, const torch::Tensor& scale) {
  if (!values.device().is_cpu()) {
    auto signs = pack_signs(values);
    values.sub_(unpack_signs(signs).mul_(scale));
    return signs;
  }
  auto signs = torch::empty({values.numel() / 8}, values.options().dtype(torch::kUInt8));
  pack_signs_and_subtract(values.data_ptr<float>(), values.numel(), scale.item<float>(), signs.data_ptr<uint8_t>());
  return signs;
}

// Σ_r sign_r · scales[r] over the (world, chunk) signs in `packed`: the chunk each rank sent, weighted by its scale.
torch::Tensor weighted_sign_sum(const torch::Tensor& packed, const torch::Tensor& scales, int world, int64_t chunk) {
  if (!packed.device().is_cpu()) {
    return unpack_signs(packed).reshape({world, chunk}).mul_(scales.reshape({world, 1})).sum(0);
  }
  auto sum = torch::empty({chunk}, scales.options());
  const auto* bytes = packed.data_ptr<uint8_t>();
  const auto* s = scales.data_ptr<float>();
  for (int r = 0; r < world; ++r) unpack_scaled(bytes + r * chunk / 8, chunk, s[r], sum.data_ptr<float>(), r > 0);
  return sum;
}

}  // namespace

CompressionErrors CompressionErrors::zeros(int64_t numel, int world_size, const torch::TensorOptions& options) {
  const int64_t padded = compressed_padded_numel(numel, world_size);
  const auto fp32 = options.dtype(torch::kFloat32);
  return {torch::zeros({padded}, fp32), torch::zeros({padded / world_size}, fp32)};
}

int64_t compressed_padded_numel(int64_t numel, int world_size) {
  // DeepSpeed's rule (its optimizers' corrected_tensor_size): a multiple of world × lcm(world, 8). The padding is
  // part of the scales' √n, so another multiple would scale differently at a world size 8 does not divide.
  const int64_t world = world_size;
  const int64_t unit = world * (world * 8 / std::gcd(world, int64_t{8}));
  return (numel + unit - 1) / unit * unit;
}

torch::Tensor pack_signs(const torch::Tensor& values) {
  if (values.numel() % 8 != 0) {
    throw std::invalid_argument("pack_signs: " + std::to_string(values.numel()) + " values, not a multiple of 8");
  }
  const auto bits = values.reshape({-1, 8}).ge(0).to(torch::kUInt8);
  return bits.mul(bit_weights(values.device())).sum(1).to(torch::kUInt8);
}

torch::Tensor unpack_signs(const torch::Tensor& packed) {
  const auto bits = packed.reshape({-1, 1}).bitwise_and(bit_weights(packed.device())).ne(0).reshape(-1);
  return bits.to(torch::kFloat32).mul_(2).sub_(1);
}

void compressed_all_reduce(Comm& comm, torch::Tensor& buffer, CompressionErrors& errors) {
  const int world = comm.world_size();
  const int64_t numel = buffer.numel();
  const int64_t padded = compressed_padded_numel(numel, world);
  const int64_t chunk = padded / world;
  if (buffer.scalar_type() != torch::kFloat32 || !buffer.is_contiguous()) {
    throw std::invalid_argument("compressed_all_reduce: the buffer must be a contiguous float32 tensor, got " +
                                std::string(buffer.is_contiguous() ? "" : "a non-contiguous ") +
                                dtype_name(buffer.scalar_type()));
  }
  if (errors.worker.numel() != padded || errors.server.numel() != chunk) {
    throw std::invalid_argument("compressed_all_reduce: errors of " + std::to_string(errors.worker.numel()) + " / " +
                                std::to_string(errors.server.numel()) + " elements for a buffer of " +
                                std::to_string(numel) + " over " + std::to_string(world) + " ranks, which needs " +
                                std::to_string(padded) + " / " + std::to_string(chunk) +
                                " (CompressionErrors::zeros)");
  }
  torch::NoGradGuard no_grad;
  // The worker: this rank's whole buffer, compensated and compressed, in the error buffer itself (its padding stays
  // the padding's own error), which then keeps what the compression lost.
  auto& m = errors.worker;
  m.narrow(0, 0, numel).add_(buffer.reshape(-1));
  const auto worker_scale = rms_scale(m);
  const auto signs = compress_in_place(m, worker_scale);  // chunk r's bytes go to rank r

  // Phase 1: each rank receives every rank's signs of the chunk it owns, and every rank's scale.
  auto received = torch::empty_like(signs);
  auto worker_scales = torch::empty({world}, worker_scale.options());
  Handle to_owners = comm.all_to_all(received, signs);
  Handle scales_out = comm.all_gather(worker_scales, worker_scale);
  to_owners.wait();
  scales_out.wait();

  // The server: the average of the chunk over the ranks, compensated and compressed again.
  auto c = weighted_sign_sum(received, worker_scales.div(world), world, chunk).add_(errors.server);
  const auto server_scale = rms_scale(c);
  const auto server_signs = compress_in_place(c, server_scale);
  errors.server.copy_(c);

  // Phase 2: every chunk's signs and scale to every rank.
  auto all_signs = torch::empty({padded / 8}, signs.options());
  auto server_scales = torch::empty({world}, server_scale.options());
  Handle signs_back = comm.all_gather(all_signs, server_signs);
  Handle scales_back = comm.all_gather(server_scales, server_scale);
  signs_back.wait();
  scales_back.wait();
  if (!buffer.device().is_cpu()) {
    const auto result = unpack_signs(all_signs).reshape({world, chunk}).mul_(server_scales.reshape({world, 1}));
    buffer.copy_(result.reshape(-1).narrow(0, 0, numel).view(buffer.sizes()));
    return;
  }
  // Chunk r's signs times its scale, straight into the buffer (its padding dropped).
  const auto* bytes = all_signs.data_ptr<uint8_t>();
  const auto* scales = server_scales.data_ptr<float>();
  float* out = buffer.data_ptr<float>();
  for (int r = 0; r < world && r * chunk < numel; ++r) {
    unpack_scaled(bytes + r * chunk / 8, std::min(chunk, numel - r * chunk), scales[r], out + r * chunk, false);
  }
}

}  // namespace dscpp
