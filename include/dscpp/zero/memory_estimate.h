// Model-state memory per rank: what params, grads, fp32 master and optimizer state cost for each ZeRO stage.
// Torch-free arithmetic, shared by `dscpp plan`/`estimate` and the tests that hold the engine's measured bytes to it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
  int64_t optimizer_state = 0;   // the optimizer's fp32 state (Adam: exp_avg + exp_avg_sq)
  int64_t device = 0;            // params + grads (+ master + state unless offloaded): the accelerator's share
  int64_t host = 0;              // offloaded to CPU memory
  int64_t nvme = 0;              // offloaded to NVMe
  int64_t total = 0;             // device + host + nvme
};

// What the optimizer keeps per parameter: fp32 tensors the size of its partition (Adam's m and v: 2), and for the
// 1-bit optimizers their error feedback, which is this rank's and not partitioned: a worker error of every element
// and a server error of 1/N of them.
struct OptimizerStateShape {
  std::string name = "Adam";
  int partitioned_floats = 2;
  bool error_feedback = false;
  bool assumed = false;  // the config names no optimizer (a script's own): Adam's shape, assumed
};

// The configured optimizer's shape (the optimizers' state_tensors() and rank_state()); Adam's when the config names
// none (a script's own optimizer), marked assumed.
OptimizerStateShape optimizer_state_shape(const std::optional<OptimizerConfig>& optimizer);

// Throws std::invalid_argument for stage outside 0..3, num_params < 0 or world_size < 1.
ModelStateBytes model_state_bytes(int stage, int64_t num_params, int world_size, OffloadDevice optimizer_offload,
                                  DType compute_dtype, const OptimizerStateShape& optimizer = {});

// DeepSpeed's cold estimators (`estimate_zero2/3_model_states_mem_needs`): per-GPU and per-CPU bytes for
// params, grads and Adam state of a model known only by its counts, for each offload choice. Their rules of thumb,
// kept as DeepSpeed writes them so our numbers match its table: the CPU side scales by `additional_buffer_factor`
// (pinned/staging buffers), ZeRO-3 keeps one gathered fp32-sized largest layer (4L bytes) on every GPU, and
// `zero_init` says whether the model is built partitioned (zero.Init) or whole on every rank's CPU first.
struct ZeroEstimateSetup {
  int64_t total_params = 0;          // Ψ, > 0
  int64_t largest_layer_params = 0;  // L, ZeRO-3 only: the largest module's own params; 0 <= L <= Ψ
  // P, ZeRO-3 only: params of at most stage3_param_persistence_threshold elements (biases, norms), which every GPU
  // keeps whole in 16 bits, 2P bytes on top of DeepSpeed's table (its estimator leaves them out); 0 <= P <= Ψ.
  int64_t persistent_params = 0;
  int num_gpus_per_node = 1;         // DeepSpeed's default 1
  int num_nodes = 1;                 // DeepSpeed's default 1
  double additional_buffer_factor = 1.5;  // DeepSpeed's default; > 0
};

struct ZeroEstimateRow {
  int stage = 2;                   // 2 or 3
  bool offload_param = false;      // ZeRO-3 offload_param=cpu
  bool offload_optimizer = false;  // offload_optimizer=cpu
  bool zero_init = true;           // ZeRO-3: built partitioned; always true for ZeRO-2 (not a ZeRO-2 option)
  int64_t cpu_bytes = 0;           // per node's CPU memory (DeepSpeed's "per CPU")
  int64_t gpu_bytes = 0;           // per GPU
};

// Throws std::invalid_argument naming the field when the setup is out of range (see the field comments).
void validate(const ZeroEstimateSetup& setup);

// One row each; the result is DeepSpeed's int() of its float expression, evaluated in the same order.
ZeroEstimateRow estimate_zero2(const ZeroEstimateSetup& setup, bool offload_optimizer);
ZeroEstimateRow estimate_zero3(const ZeroEstimateSetup& setup, bool offload_param, bool offload_optimizer,
                               bool zero_init);

// The rows DeepSpeed's `..._all_cold` prints, in its order: offload_optimizer cpu then none; for ZeRO-3 within
// each, offload_param cpu then none (param offload needs optimizer offload), zero_init 1 then 0.
std::vector<ZeroEstimateRow> estimate_zero2_rows(const ZeroEstimateSetup& setup);
std::vector<ZeroEstimateRow> estimate_zero3_rows(const ZeroEstimateSetup& setup);

}  // namespace dscpp
