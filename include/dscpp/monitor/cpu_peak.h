// cpu_peak_flops: the FLOP/s a CPU's vector units could reach at most — SIMD lanes × FMA pipes × 2 × clock ×
// cores — the denominator of an MFU that can be compared across machines. The measured-matmul peak
// (measure_peak_flops) says how close the model gets to what LibTorch's best kernel does here; this one says how
// close both get to the silicon.
//
// What /proc/cpuinfo cannot tell (how many FMA pipes a core has) is taken from the vendor and the widest extension:
//   AMD (Zen 1-5)        2 FMA pipes of 256 bits (Zen 4 runs 512-bit instructions as two halves): 32 fp32 FLOP/cycle
//   Intel with AVX-512   2 FMA units of 512 bits (Xeon Gold/Platinum; some Silver/Bronze and client parts have
//                        one, and then this is twice their peak): 64 fp32 FLOP/cycle
//   otherwise AVX2+FMA   2 pipes of 256 bits: 32; without FMA, SSE: 4 lanes × (1 mul + 1 add): 8
// bf16: twice fp32 with avx512_bf16 (VDPBF16PS: two products per fp32 lane), 1024 per core with amx_bf16 (a
// 16×16×32 tile product per 16 cycles); otherwise bf16 computes in fp32. fp64: half of fp32.
// The clock is cpufreq's cpuinfo_max_freq where the kernel exposes it, else /proc/cpuinfo's "cpu MHz" (on a VM,
// the nominal clock: turbo can exceed it, so MFU can read slightly high).
#pragma once

#include <torch/torch.h>

#include <string>

namespace dscpp {

struct CpuPeak {
  double flops = 0;             // FLOP/s; 0 where /proc/cpuinfo could not be read
  double flops_per_cycle = 0;   // per core, for the dtype
  double ghz = 0;
  int cores = 0;
  std::string how;              // "AMD, 2 x 256-bit FMA: 32 fp32 FLOP/cycle x 2.10 GHz x 2 cores"
};

// From the text of /proc/cpuinfo (its first processor's fields), `max_khz` (cpufreq's cpuinfo_max_freq, 0 when
// absent) and the cores the work runs on.
CpuPeak cpu_peak_from_cpuinfo(const std::string& cpuinfo, double max_khz, torch::ScalarType dtype, int cores);

// This machine's, for `cores` cores (default: LibTorch's intra-op threads, what one rank computes with).
CpuPeak cpu_peak_flops(torch::ScalarType dtype, int cores = 0);

}  // namespace dscpp
