// Model-state bytes per rank for each ZeRO stage (SPEC §3.6). Torch-free: plain arithmetic on Ψ and N.
#include "dscpp/zero/memory_estimate.h"

#include <stdexcept>
#include <string>

namespace dscpp {

ModelStateBytes model_state_bytes(int stage, int64_t num_params, int world_size, OffloadDevice optimizer_offload,
                                  DType compute_dtype) {
  if (stage < 0 || stage > 3) throw std::invalid_argument("model_state_bytes: stage " + std::to_string(stage) +
                                                          " is not one of 0, 1, 2, 3");
  if (num_params < 0) throw std::invalid_argument("model_state_bytes: num_params must be >= 0");
  if (world_size < 1) throw std::invalid_argument("model_state_bytes: world_size must be >= 1");

  const int64_t whole = num_params;
  const int64_t shard = stage == 0 ? whole : (num_params + world_size - 1) / world_size;  // ceil(Ψ/N)
  const bool fp32 = compute_dtype == DType::kFloat32;
  const bool offload = optimizer_offload != OffloadDevice::kNone;
  const int64_t width = fp32 ? 4 : 2;

  ModelStateBytes b;
  b.params = width * (stage >= 3 ? shard : whole);
  b.grads = width * (stage >= 2 ? shard : whole);
  // The optimizer's own state is partitioned from stage 1 on; stage 0 uses `shard == whole`.
  b.master32 = (fp32 && !offload) ? 0 : 4 * shard;
  b.optimizer_state = 8 * shard;

  const int64_t optimizer_side = b.master32 + b.optimizer_state;
  b.device = b.params + b.grads + (offload ? 0 : optimizer_side);
  if (optimizer_offload == OffloadDevice::kCpu) b.host = optimizer_side;
  if (optimizer_offload == OffloadDevice::kNvme) b.nvme = optimizer_side;
  b.total = b.device + b.host + b.nvme;
  return b;
}

}  // namespace dscpp
