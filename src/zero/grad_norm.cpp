// squared_norm_fp64: row-wise norms combined in fp64.
#include "dscpp/zero/grad_norm.h"

namespace dscpp {

torch::Tensor squared_norm_fp64(const torch::Tensor& t) {
  constexpr int64_t kRow = int64_t{1} << 16;
  const int64_t rows = t.numel() / kRow;
  const int64_t rest = t.numel() - rows * kRow;
  auto total = torch::zeros({}, t.options().dtype(torch::kFloat64));
  if (rows > 0) {
    total += t.narrow(0, 0, rows * kRow).view({rows, kRow}).norm(2, {1}).to(torch::kFloat64).square().sum();
  }
  if (rest > 0) {
    auto tail = t.narrow(0, rows * kRow, rest).norm().to(torch::kFloat64);
    total += tail * tail;
  }
  return total;
}

}  // namespace dscpp
