// Model-state memory per rank (SPEC §3.6): what params, grads, fp32 master and Adam state cost for each ZeRO stage.
// Torch-free arithmetic, shared by `dscpp plan`/`estimate` and the tests that hold the engine's measured bytes to it.
#pragma once

#include <cstdint>

#include "dscpp/config/config.h"

namespace dscpp {

// Bytes one rank holds, by kind. Partitioned kinds count ceil(Ψ/N) elements (a rank's shard, padding ignored).
// 16-bit compute (fp16/bf16), Adam: params 2Ψ, grads 2Ψ, master 4Ψ, state (m, v) 8Ψ
//   → stage 0 16Ψ; stage 1 4Ψ + 12Ψ/N; stage 2 2Ψ + 14Ψ/N; stage 3 16Ψ/N.
// fp32 compute: the params are the master (master32 = 0), grads 4Ψ, state 8Ψ
//   → stage 0 16Ψ; stage 1 8Ψ + 8Ψ/N; stage 2 4Ψ + 12Ψ/N; stage 3 16Ψ/N.
// Optimizer offload (cpu or nvme) moves the master shard and the optimizer state off the device: with fp32
// compute the offloaded step needs its own fp32 master copy of the shard (as DeepSpeed keeps one), so
// master32 becomes 4Ψ/N off-device. Stage 0 with offload is computed as if unpartitioned (N = 1 shard).
struct ModelStateBytes {
  int64_t params = 0;            // model params in the compute dtype (2 or 4 bytes each)
  int64_t grads = 0;             // gradients in the compute dtype
  int64_t master32 = 0;          // fp32 master params (none for fp32 compute without offload)
  int64_t optimizer_state = 0;   // Adam exp_avg + exp_avg_sq, fp32
  int64_t device = 0;            // params + grads (+ master + state unless offloaded): the accelerator's share
  int64_t host = 0;              // offloaded to CPU memory
  int64_t nvme = 0;              // offloaded to NVMe
  int64_t total = 0;             // device + host + nvme
};

// Throws std::invalid_argument for stage outside 0..3, num_params < 0 or world_size < 1.
ModelStateBytes model_state_bytes(int stage, int64_t num_params, int world_size, OffloadDevice optimizer_offload,
                                  DType compute_dtype);

}  // namespace dscpp
