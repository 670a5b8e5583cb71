// CPU Adam, AVX2 + FMA + F16C: 8 floats per instruction; the tail goes through the scalar kernel.
#include <immintrin.h>

#include "cpu_adam_kernels.h"

namespace dscpp::detail {
namespace {

// fp32 → bf16, round to nearest even, NaN kept quiet (as c10::BFloat16 rounds).
__attribute__((target("avx2,fma,f16c"))) inline __m128i to_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), nan);
  // Pack the eight 32-bit lanes (values < 2^16) into 16 bits; packus works per 128-bit half, so fix the order.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(rounded, rounded), 0xD8);
  return _mm256_castsi256_si128(packed);
}

}  // namespace

__attribute__((target("avx2,fma,f16c"))) void adam_tile_avx2(const AdamConstants& c, float* p, const float* g,
                                                               float* m, float* v, int64_t n, void* p16,
                                                               c10::ScalarType p16_dtype) {
  const __m256 beta1 = _mm256_set1_ps(c.beta1), one_minus_beta1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2), one_minus_beta2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(c.eps), decay = _mm256_set1_ps(c.decay), l2 = _mm256_set1_ps(c.l2);
  const __m256 step_size = _mm256_set1_ps(c.step_size), inv_sqrt_bc2 = _mm256_set1_ps(c.inv_sqrt_bc2);
  const bool bf16 = p16_dtype == c10::ScalarType::BFloat16;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 param = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    const __m256 grad = _mm256_fmadd_ps(l2, param, _mm256_loadu_ps(g + i));
    const __m256 mi = _mm256_fmadd_ps(beta1, _mm256_loadu_ps(m + i), _mm256_mul_ps(one_minus_beta1, grad));
    const __m256 vi =
        _mm256_fmadd_ps(beta2, _mm256_loadu_ps(v + i), _mm256_mul_ps(one_minus_beta2, _mm256_mul_ps(grad, grad)));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), inv_sqrt_bc2, eps);
    param = _mm256_fnmadd_ps(step_size, _mm256_div_ps(mi, denom), param);
    _mm256_storeu_ps(p + i, param);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    if (p16 == nullptr) continue;
    auto* out = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(p16) + i);
    _mm_storeu_si128(out, bf16 ? to_bf16(param) : _mm256_cvtps_ph(param, _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    adam_tile_scalar(c, p + i, g + i, m + i, v + i, n - i,
                     p16 == nullptr ? nullptr : static_cast<uint16_t*>(p16) + i, p16_dtype);
  }
}

}  // namespace dscpp::detail
