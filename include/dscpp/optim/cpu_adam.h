// CPU Adam: one fused pass over flat fp32 buffers (param, grad, exp_avg, exp_avg_sq) that also writes the 16-bit
// copy of the updated parameters (ZeRO-Offload's CPU optimizer). Each element is read and written once: 28 bytes
// per parameter for fp32 state with a 16-bit copy (p, m, v read and written, g read, p16 written). Vector paths
// for AVX-512 and AVX2 (+FMA, F16C) are chosen at run time from the CPU's features, with a scalar fallback, and the
// buffer is split into tiles over OpenMP threads.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace dscpp {

enum class SimdPath { kScalar, kAvx2, kAvx512 };

// The widest path this CPU supports.
SimdPath best_simd_path();
bool simd_path_supported(SimdPath path);
std::string to_string(SimdPath path);

// One Adam step's constants (the same arithmetic as FlatAdam: torch.optim.Adam/AdamW, DeepSpeed's FusedAdam).
struct AdamStepConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;        // AdamW: p *= 1 - lr·wd; else L2: g + wd·p
  bool bias_correction = true;
  int64_t step = 1;             // the step being taken, counting from 1
};

// Updates param, exp_avg and exp_avg_sq in place for `n` elements; when `param16` is not null, also writes the
// updated parameters rounded to `param16_dtype` (kBFloat16 or kHalf, round to nearest even, as Tensor::to does).
// `threads` ≤ 0 uses OpenMP's default. Throws std::invalid_argument for an unsupported path or dtype.
void cpu_adam_step(const AdamStepConfig& config, float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                   int64_t n, void* param16 = nullptr, c10::ScalarType param16_dtype = c10::ScalarType::BFloat16,
                   SimdPath path = best_simd_path(), int threads = 0);

}  // namespace dscpp
