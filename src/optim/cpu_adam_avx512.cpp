// CPU Adam, AVX-512 (F + BW): 16 floats per instruction; the tail goes through the scalar kernel.
#include <immintrin.h>

#include "cpu_adam_kernels.h"

namespace dscpp::detail {
namespace {

// fp32 → bf16, round to nearest even, NaN kept quiet (as c10::BFloat16 rounds).
__attribute__((target("avx512f,avx512bw"))) inline __m256i to_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(rounded);
}

}  // namespace

__attribute__((target("avx512f,avx512bw"))) void adam_tile_avx512(const AdamConstants& c, float* p, const float* g,
                                                                   float* m, float* v, int64_t n, void* p16,
                                                                   c10::ScalarType p16_dtype) {
  const __m512 beta1 = _mm512_set1_ps(c.beta1), one_minus_beta1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2), one_minus_beta2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(c.eps), decay = _mm512_set1_ps(c.decay), l2 = _mm512_set1_ps(c.l2);
  const __m512 step_size = _mm512_set1_ps(c.step_size), inv_sqrt_bc2 = _mm512_set1_ps(c.inv_sqrt_bc2);
  const bool bf16 = p16_dtype == c10::ScalarType::BFloat16;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 param = _mm512_mul_ps(_mm512_loadu_ps(p + i), decay);
    const __m512 grad = _mm512_fmadd_ps(l2, param, _mm512_loadu_ps(g + i));
    const __m512 mi = _mm512_fmadd_ps(beta1, _mm512_loadu_ps(m + i), _mm512_mul_ps(one_minus_beta1, grad));
    const __m512 vi =
        _mm512_fmadd_ps(beta2, _mm512_loadu_ps(v + i), _mm512_mul_ps(one_minus_beta2, _mm512_mul_ps(grad, grad)));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), inv_sqrt_bc2, eps);
    param = _mm512_fnmadd_ps(step_size, _mm512_div_ps(mi, denom), param);
    _mm512_storeu_ps(p + i, param);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    if (p16 == nullptr) continue;
    auto* out = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(p16) + i);
    _mm256_storeu_si256(out, bf16 ? to_bf16(param) : _mm512_cvtps_ph(param, _MM_FROUND_TO_NEAREST_INT));
  }
  if (i < n) {
    adam_tile_scalar(c, p + i, g + i, m + i, v + i, n - i,
                     p16 == nullptr ? nullptr : static_cast<uint16_t*>(p16) + i, p16_dtype);
  }
}

}  // namespace dscpp::detail
