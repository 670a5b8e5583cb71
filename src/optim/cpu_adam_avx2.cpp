// CPU Adam, AVX2 + FMA + F16C: 8 floats per instruction; the tail (fewer than 8
// elements) goes through the same vector arithmetic on a padded copy, so an element's result does not depend on
// where a partition or tile boundary falls (ZeRO's layouts agree bit for bit).
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

// One vector of 8 elements: p, m, v updated in place, the 16-bit copy written when p16 is not null; the arithmetic
// of cpu_adam_kernels.h, operation for operation. Inlined into the tile loop, which hoists the constants' broadcasts.
__attribute__((target("avx2,fma,f16c"))) inline void update(const AdamConstants& c, float* p, const float* g,
                                                      float* m, float* v, uint16_t* p16, bool bf16) {
  __m256 param = _mm256_loadu_ps(p);
  if (c.decay != 1.0f) param = _mm256_mul_ps(param, _mm256_set1_ps(c.decay));
  __m256 grad = _mm256_loadu_ps(g);
  if (c.l2 != 0.0f) grad = _mm256_fmadd_ps(param, _mm256_set1_ps(c.l2), grad);
  const __m256 m_old = _mm256_loadu_ps(m);
  const __m256 diff = _mm256_sub_ps(grad, m_old);
  const __m256 mi = c.small_weight ? _mm256_fmadd_ps(_mm256_set1_ps(c.lerp_weight), diff, m_old)
                                   : _mm256_fnmadd_ps(diff, _mm256_set1_ps(c.lerp_rest), grad);
  const __m256 vi = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(c.one_minus_beta2), grad), grad,
                                  _mm256_mul_ps(_mm256_loadu_ps(v), _mm256_set1_ps(c.beta2)));
  const __m256 root = _mm256_sqrt_ps(vi);
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(root, _mm256_set1_ps(c.sqrt_bc2)), _mm256_set1_ps(c.eps));
  param = _mm256_sub_ps(param, _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(c.step_size), mi), denom));
  _mm256_storeu_ps(p, param);
  _mm256_storeu_ps(m, mi);
  _mm256_storeu_ps(v, vi);
  if (p16 == nullptr) return;
  const __m128i half = bf16 ? to_bf16(param) : _mm256_cvtps_ph(param, _MM_FROUND_TO_NEAREST_INT);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p16), half);
}

}  // namespace

__attribute__((target("avx2,fma,f16c"))) void adam_tile_avx2(const AdamConstants& c, float* p, const float* g,
                                                      float* m, float* v, int64_t n, void* p16,
                                                      c10::ScalarType p16_dtype) {
  const bool bf16 = p16_dtype == c10::ScalarType::BFloat16;
  auto* half = static_cast<uint16_t*>(p16);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) update(c, p + i, g + i, m + i, v + i, half == nullptr ? nullptr : half + i, bf16);
  if (i == n) return;
  update_tail<8>(p + i, g + i, m + i, v + i, half == nullptr ? nullptr : half + i, n - i,
                  [&](float* tp, const float* tg, float* tm, float* tv, uint16_t* t16) {
                    update(c, tp, tg, tm, tv, t16, bf16);
                  });
}

}  // namespace dscpp::detail
