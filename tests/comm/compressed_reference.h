// A plain-tensor reference of compressed_all_reduce (comm/compressed_allreduce.h) that runs every rank in one
// process, on ±1 floats with no bit packing: what the comm test and the 1-bit optimizers' tests check ranks against.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "dscpp/comm/compressed_allreduce.h"

namespace dscpp::testing {

inline torch::Tensor plus_minus(const torch::Tensor& t) { return torch::where(t.ge(0), 1.0, -1.0).to(torch::kFloat32); }

inline torch::Tensor rms(const torch::Tensor& t) { return t.norm() / std::sqrt(static_cast<double>(t.numel())); }

// Every rank's error feedback for one buffer of `numel` elements over `world` ranks.
struct CompressedReference {
  int64_t numel;
  std::vector<torch::Tensor> worker, server;  // per rank

  CompressedReference(int64_t numel_, int world) : numel(numel_) {
    const int64_t padded = compressed_padded_numel(numel, world);
    for (int r = 0; r < world; ++r) {
      worker.push_back(torch::zeros({padded}));
      server.push_back(torch::zeros({padded / world}));
    }
  }

  // The result every rank gets for these inputs (one per rank).
  torch::Tensor call(const std::vector<torch::Tensor>& inputs) {
    const int world = static_cast<int>(inputs.size());
    const int64_t padded = compressed_padded_numel(numel, world), chunk = padded / world;
    std::vector<torch::Tensor> signs, scales;
    for (int r = 0; r < world; ++r) {
      auto m = torch::zeros({padded});
      m.narrow(0, 0, numel).copy_(inputs[r]);
      m += worker[r];
      scales.push_back(rms(m));
      signs.push_back(plus_minus(m));
      worker[r] = m - scales[r] * signs[r];
    }
    auto result = torch::zeros({padded});
    for (int k = 0; k < world; ++k) {  // rank k owns chunk k
      std::vector<torch::Tensor> parts;
      for (int r = 0; r < world; ++r) parts.push_back(signs[r].narrow(0, k * chunk, chunk) * (scales[r] / world));
      auto c = torch::stack(parts).sum(0) + server[k];
      const auto scale = rms(c);
      server[k] = c - scale * plus_minus(c);
      result.narrow(0, k * chunk, chunk).copy_(scale * plus_minus(c));
    }
    return result.narrow(0, 0, numel);
  }
};

}  // namespace dscpp::testing
