// CPU Adam: constants, path selection, the scalar kernel, and the tiling over OpenMP threads.
#include "dscpp/optim/cpu_adam.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <omp.h>

#include <cmath>
#include <stdexcept>

#include "cpu_adam_kernels.h"

namespace dscpp {
namespace detail {

void adam_tile_scalar(const AdamConstants& c, float* p, const float* g, float* m, float* v, int64_t n, void* p16,
                      c10::ScalarType p16_dtype) {
  for (int64_t i = 0; i < n; ++i) {
    float param = c.decay == 1.0f ? p[i] : p[i] * c.decay;
    const float grad = c.l2 == 0.0f ? g[i] : std::fma(param, c.l2, g[i]);
    const float diff = grad - m[i];
    const float mi = c.small_weight ? std::fma(c.lerp_weight, diff, m[i]) : std::fma(-diff, c.lerp_rest, grad);
    const float vi = std::fma(c.one_minus_beta2 * grad, grad, v[i] * c.beta2);
    const float denom = std::sqrt(vi) / c.sqrt_bc2 + c.eps;
    param -= (c.step_size * mi) / denom;
    p[i] = param;
    m[i] = mi;
    v[i] = vi;
    if (p16 == nullptr) continue;
    if (p16_dtype == c10::ScalarType::BFloat16) {
      static_cast<c10::BFloat16*>(p16)[i] = c10::BFloat16(param);
    } else {
      static_cast<c10::Half*>(p16)[i] = c10::Half(param);
    }
  }
}

}  // namespace detail

bool simd_path_supported(SimdPath path) {
  switch (path) {
    case SimdPath::kScalar:
      return true;
    case SimdPath::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    case SimdPath::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }
  return false;
}

SimdPath best_simd_path() {
  static const SimdPath best = simd_path_supported(SimdPath::kAvx512) ? SimdPath::kAvx512
                               : simd_path_supported(SimdPath::kAvx2) ? SimdPath::kAvx2
                                                                      : SimdPath::kScalar;
  return best;
}

std::string to_string(SimdPath path) {
  switch (path) {
    case SimdPath::kScalar:
      return "scalar";
    case SimdPath::kAvx2:
      return "avx2";
    case SimdPath::kAvx512:
      return "avx512";
  }
  return "?";
}

void cpu_adam_step(const AdamStepConfig& config, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                   int64_t n, void* param16, c10::ScalarType param16_dtype, SimdPath path, int threads) {
  if (!simd_path_supported(path)) {
    throw std::invalid_argument("cpu_adam_step: this CPU has no " + to_string(path) + " path");
  }
  if (param16 != nullptr && param16_dtype != c10::ScalarType::BFloat16 && param16_dtype != c10::ScalarType::Half) {
    throw std::invalid_argument(std::string("cpu_adam_step: the 16-bit copy must be bf16 or fp16, got ") +
                                c10::toString(param16_dtype));
  }
  const double bc1 = config.bias_correction ? 1.0 - std::pow(config.beta1, static_cast<double>(config.step)) : 1.0;
  const double bc2 = config.bias_correction ? 1.0 - std::pow(config.beta2, static_cast<double>(config.step)) : 1.0;
  const bool decoupled = config.decoupled && config.weight_decay != 0.0;
  detail::AdamConstants c{};
  c.lerp_weight = static_cast<float>(1.0 - config.beta1);
  c.lerp_rest = 1.0f - c.lerp_weight;
  c.small_weight = std::abs(c.lerp_weight) < 0.5f;
  c.beta2 = static_cast<float>(config.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
  c.eps = static_cast<float>(config.eps);
  c.decay = static_cast<float>(decoupled ? 1.0 - config.lr * config.weight_decay : 1.0);
  c.l2 = static_cast<float>(config.decoupled ? 0.0 : config.weight_decay);
  c.step_size = static_cast<float>(config.lr / bc1);
  c.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  auto* kernel = path == SimdPath::kAvx512 ? detail::adam_tile_avx512
                 : path == SimdPath::kAvx2 ? detail::adam_tile_avx2
                                           : detail::adam_tile_scalar;
  // Tiles of 64K elements (1.75 MB of traffic): big enough to amortise scheduling, small enough to balance threads.
  constexpr int64_t kTile = int64_t{1} << 16;
  const int64_t tiles = (n + kTile - 1) / kTile;
  const size_t p16_bytes = param16 == nullptr ? 0 : 2;
  const int team = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(team) if (tiles > 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t begin = t * kTile;
    const int64_t len = std::min(kTile, n - begin);
    void* p16 = param16 == nullptr ? nullptr : static_cast<char*>(param16) + begin * p16_bytes;
    kernel(c, param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin, len, p16, param16_dtype);
  }
}

}  // namespace dscpp
