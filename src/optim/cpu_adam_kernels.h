// Private to src/optim: the per-path CPU Adam kernels over one tile. Each file compiles its kernel for its own
// instruction set (function target attributes), so the library needs no global -m flags and runs on any x86-64.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace dscpp::detail {

// The step's constants, derived once per step.
struct AdamConstants {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float eps;
  float decay;          // AdamW: p *= decay (1 - lr·wd); 1 when not decoupled
  float l2;             // L2: g += l2·p; 0 when decoupled
  float step_size;      // lr / bias_correction1
  float inv_sqrt_bc2;   // 1 / sqrt(bias_correction2)
};

// Tile kernels: elements [0, n) of the given pointers; `p16` may be null.
void adam_tile_scalar(const AdamConstants& c, float* p, const float* g, float* m, float* v, int64_t n, void* p16,
                      c10::ScalarType p16_dtype);
void adam_tile_avx2(const AdamConstants& c, float* p, const float* g, float* m, float* v, int64_t n, void* p16,
                    c10::ScalarType p16_dtype);
void adam_tile_avx512(const AdamConstants& c, float* p, const float* g, float* m, float* v, int64_t n, void* p16,
                      c10::ScalarType p16_dtype);

}  // namespace dscpp::detail
