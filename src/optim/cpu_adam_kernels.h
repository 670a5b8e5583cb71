// Private to src/optim: the per-path CPU Adam kernels over one tile. Each file compiles its kernel for its own
// instruction set (function target attributes), so the library needs no global -m flags and runs on any x86-64.
#pragma once

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cstdint>

namespace dscpp::detail {

// The step's constants, derived once per step, each rounded to fp32 as torch.optim rounds its Python scalars.
struct AdamConstants {
  float lerp_weight;     // 1 - beta1: exp_avg.lerp_(grad, 1 - beta1)
  float lerp_rest;       // 1 - lerp_weight in fp32, for lerp's form at weights >= 0.5
  bool small_weight;     // lerp_weight < 0.5: lerp as m + w·(g − m), else g − (g − m)·(1 − w) (ATen's two forms)
  float beta2, one_minus_beta2;
  float eps;
  float decay;           // AdamW: p *= decay (1 - lr·wd); 1 when not decoupled
  float l2;              // Adam: g += l2·p; 0 when decoupled
  float step_size;       // lr / bias_correction1
  float sqrt_bc2;        // sqrt(bias_correction2), divided by as torch.optim divides
};

// Every path computes, per element, what torch.optim.Adam/AdamW's single-tensor step computes on the CPU, fused
// multiply-adds where ATen's kernels fuse, but for the square root, correctly rounded here (torch's CPU sqrt is MKL's,
// within an ulp): tests/python/test_initialize.py holds the engine bit for bit to tests/python/training.py's
// ReferenceAdam, which is torch.optim's step with that root.
//   p = p·decay                      g = fma(p, l2, g)              (AdamW / Adam's L2, when not zero)
//   m = fma(w, g − m, m)             (lerp, w < 0.5; else fma(−(g − m), 1 − w, g))
//   v = fma((1 − β2)·g, g, v·β2)
//   p = p − (step_size·m) / (sqrt(v) / sqrt(bc2) + eps)
// The last `rest` (< kWidth) elements of a tile through a vector kernel's `update(p, g, m, v, p16)` of kWidth
// elements: copied into zero-padded buffers, updated, copied back, so they get the same arithmetic as the vector
// body (the padding lanes' results, finite or NaN when eps is 0, are never copied back).
template <int kWidth, typename Update>
void update_tail(float* p, const float* g, float* m, float* v, uint16_t* p16, int64_t rest, Update&& update) {
  float tp[kWidth] = {}, tg[kWidth] = {}, tm[kWidth] = {}, tv[kWidth] = {};
  uint16_t t16[kWidth] = {};
  std::copy_n(p, rest, tp);
  std::copy_n(g, rest, tg);
  std::copy_n(m, rest, tm);
  std::copy_n(v, rest, tv);
  update(tp, tg, tm, tv, p16 == nullptr ? nullptr : t16);
  std::copy_n(tp, rest, p);
  std::copy_n(tm, rest, m);
  std::copy_n(tv, rest, v);
  if (p16 != nullptr) std::copy_n(t16, rest, p16);
}

// Tile kernels: elements [0, n) of the given pointers; `p16` may be null.
void adam_tile_scalar(const AdamConstants& c, float* p, const float* g, float* m, float* v, int64_t n, void* p16,
                      c10::ScalarType p16_dtype);
void adam_tile_avx2(const AdamConstants& c, float* p, const float* g, float* m, float* v, int64_t n, void* p16,
                    c10::ScalarType p16_dtype);
void adam_tile_avx512(const AdamConstants& c, float* p, const float* g, float* m, float* v, int64_t n, void* p16,
                      c10::ScalarType p16_dtype);

}  // namespace dscpp::detail
