// squared_norm_fp64: the sum of squares accumulated in fp64, chunk by chunk.
#include "dscpp/zero/grad_norm.h"

#include <algorithm>

namespace dscpp {

torch::Tensor squared_norm_fp64(const torch::Tensor& t) {
  // Each chunk is widened into one fp64 buffer and dotted with itself (BLAS ddot): exact to fp64 rounding, and no
  // fp64 copy of the whole shard. On the CPU the buffer stays cache-resident (~3x the time of fp32 row norms: 23 vs
  // 8 ms per 50M elements on one core). On a GPU each chunk costs three kernel launches whatever its size, so chunks
  // are 64x larger (a 32 MB buffer). With 64K-element chunks, gpt2's 86M gradients took ~4,000 launches, and the
  // optimizer phase was 54 of a 73 ms step on an H200 (scripts/device-check.sh, 2026-11-27).
  const int64_t chunk_numel = t.device().is_cpu() ? int64_t{1} << 16 : int64_t{1} << 22;
  const auto flat = t.reshape(-1);
  const int64_t n = flat.numel();
  auto total = torch::zeros({}, t.options().dtype(torch::kFloat64));
  auto buffer = torch::empty({std::min(chunk_numel, n)}, t.options().dtype(torch::kFloat64));
  for (int64_t begin = 0; begin < n; begin += chunk_numel) {
    const int64_t length = std::min(chunk_numel, n - begin);
    auto chunk = buffer.narrow(0, 0, length);
    chunk.copy_(flat.narrow(0, begin, length));
    total += chunk.dot(chunk);
  }
  return total;
}

}  // namespace dscpp
