// CPU Adam, AVX-512 (F + BW): 16 floats per instruction; the tail (fewer than 16
// elements) goes through the same vector arithmetic on a padded copy, so an element's result does not depend on
// where a partition or tile boundary falls (ZeRO's layouts agree bit for bit).
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

// One vector of 16 elements: p, m, v updated in place, the 16-bit copy written when p16 is not null; the arithmetic
// of cpu_adam_kernels.h, operation for operation. Inlined into the tile loop, which hoists the constants' broadcasts.
__attribute__((target("avx512f,avx512bw"))) inline void update(const AdamConstants& c, float* p, const float* g,
                                                      float* m, float* v, uint16_t* p16, bool bf16) {
  __m512 param = _mm512_loadu_ps(p);
  if (c.decay != 1.0f) param = _mm512_mul_ps(param, _mm512_set1_ps(c.decay));
  __m512 grad = _mm512_loadu_ps(g);
  if (c.l2 != 0.0f) grad = _mm512_fmadd_ps(param, _mm512_set1_ps(c.l2), grad);
  const __m512 m_old = _mm512_loadu_ps(m);
  const __m512 diff = _mm512_sub_ps(grad, m_old);
  const __m512 mi = c.small_weight ? _mm512_fmadd_ps(_mm512_set1_ps(c.lerp_weight), diff, m_old)
                                   : _mm512_fnmadd_ps(diff, _mm512_set1_ps(c.lerp_rest), grad);
  const __m512 vi = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(c.one_minus_beta2), grad), grad,
                                  _mm512_mul_ps(_mm512_loadu_ps(v), _mm512_set1_ps(c.beta2)));
  const __m512 root = _mm512_sqrt_ps(vi);
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(root, _mm512_set1_ps(c.sqrt_bc2)), _mm512_set1_ps(c.eps));
  param = _mm512_sub_ps(param, _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(c.step_size), mi), denom));
  _mm512_storeu_ps(p, param);
  _mm512_storeu_ps(m, mi);
  _mm512_storeu_ps(v, vi);
  if (p16 == nullptr) return;
  const __m256i half = bf16 ? to_bf16(param) : _mm512_cvtps_ph(param, _MM_FROUND_TO_NEAREST_INT);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p16), half);
}

}  // namespace

__attribute__((target("avx512f,avx512bw"))) void adam_tile_avx512(const AdamConstants& c, float* p, const float* g,
                                                      float* m, float* v, int64_t n, void* p16,
                                                      c10::ScalarType p16_dtype) {
  const bool bf16 = p16_dtype == c10::ScalarType::BFloat16;
  auto* half = static_cast<uint16_t*>(p16);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) update(c, p + i, g + i, m + i, v + i, half == nullptr ? nullptr : half + i, bf16);
  if (i == n) return;
  update_tail<16>(p + i, g + i, m + i, v + i, half == nullptr ? nullptr : half + i, n - i,
                  [&](float* tp, const float* tg, float* tm, float* tv, uint16_t* t16) {
                    update(c, tp, tg, tm, tv, t16, bf16);
                  });
}

}  // namespace dscpp::detail
