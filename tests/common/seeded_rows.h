// Regression rows that are the same on every rank and world size: row i is drawn from its own generator (seed
// i + 1), so a rank takes its share of a global batch by index and k processes see exactly one process's batch.
#pragma once

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace dscpp::testing {

// Rows [first, first + count) of `width` features, and a target of each: sin of the sum of its first four features.
inline std::pair<torch::Tensor, torch::Tensor> seeded_rows(int64_t first, int64_t count, int64_t width) {
  std::vector<torch::Tensor> xs;
  for (int64_t i = first; i < first + count; ++i) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(i + 1));
    xs.push_back(torch::randn({width}, gen));
  }
  auto x = torch::stack(xs);
  return {x, x.narrow(1, 0, 4).sum(1, true).sin()};
}

}  // namespace dscpp::testing
