// Model-state bytes per rank for each ZeRO stage, and DeepSpeed's cold per-GPU/per-CPU estimators
//. Torch-free: plain arithmetic on Ψ and N.
#include "dscpp/zero/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

namespace dscpp {

OptimizerStateShape optimizer_state_shape(const std::optional<OptimizerConfig>& optimizer) {
  if (!optimizer) return {"Adam", 2, false, true};
  return std::visit(
      [&](const auto& o) -> OptimizerStateShape {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, AdamOptions>) return {optimizer->type, o.amsgrad ? 3 : 2, false};
        if constexpr (std::is_same_v<T, SgdOptions>) return {optimizer->type, o.momentum != 0.0 ? 1 : 0, false};
        if constexpr (std::is_same_v<T, LionOptions> || std::is_same_v<T, AdagradOptions>) {
          return {optimizer->type, 1, false};
        }
        if constexpr (std::is_same_v<T, LambOptions>) return {optimizer->type, 2, false};
        if constexpr (std::is_same_v<T, OneBitLambOptions>) return {optimizer->type, 3, true};  // + fresh variance
        return {optimizer->type, 2, true};  // OneBitAdam, ZeroOneAdam
      },
      optimizer->options);
}

ModelStateBytes model_state_bytes(int stage, int64_t num_params, int world_size, OffloadDevice optimizer_offload,
                                  DType compute_dtype, const OptimizerStateShape& optimizer) {
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
  b.optimizer_state = 4 * optimizer.partitioned_floats * shard;
  if (optimizer.error_feedback) b.optimizer_state += 4 * (whole + (whole + world_size - 1) / world_size);

  const int64_t optimizer_side = b.master32 + b.optimizer_state;
  b.device = b.params + b.grads + (offload ? 0 : optimizer_side);
  if (optimizer_offload == OffloadDevice::kCpu) b.host = optimizer_side;
  if (optimizer_offload == OffloadDevice::kNvme) b.nvme = optimizer_side;
  b.total = b.device + b.host + b.nvme;
  return b;
}

namespace {

// DeepSpeed's estimators are Python: integer products stay exact, a product with a float (the buffer factor,
// 1/num_nodes, a true division) becomes a double, and int() truncates. These helpers keep that order of evaluation
// so that our bytes equal DeepSpeed's to the byte, not just to the printed 0.01 GiB.
int64_t truncate(double value) { return static_cast<int64_t>(value); }

// Python's `count * max(int_factor, float_factor)`: max keeps the int when the float is not greater, and then the
// product is exact before it is converted.
double times_max(int64_t count, int64_t int_factor, double float_factor) {
  if (float_factor > static_cast<double>(int_factor)) return static_cast<double>(count) * float_factor;
  return static_cast<double>(count * int_factor);
}

int64_t total_gpus(const ZeroEstimateSetup& s) { return static_cast<int64_t>(s.num_nodes) * s.num_gpus_per_node; }

}  // namespace

void validate(const ZeroEstimateSetup& s) {
  // 18Ψ must stay exact in a double, as it is in Python, for the true divisions below.
  constexpr int64_t kMaxParams = int64_t{1} << 48;
  if (s.total_params <= 0 || s.total_params > kMaxParams) {
    throw std::invalid_argument("total_params = " + std::to_string(s.total_params) + ": must be in 1.." +
                                std::to_string(kMaxParams));
  }
  if (s.largest_layer_params < 0 || s.largest_layer_params > s.total_params) {
    throw std::invalid_argument("largest_layer_params = " + std::to_string(s.largest_layer_params) +
                                ": must be in 0..total_params (" + std::to_string(s.total_params) + ")");
  }
  if (s.persistent_params < 0 || s.persistent_params > s.total_params) {
    throw std::invalid_argument("persistent_params = " + std::to_string(s.persistent_params) +
                                ": must be in 0..total_params (" + std::to_string(s.total_params) + ")");
  }
  if (s.num_gpus_per_node < 1) {
    throw std::invalid_argument("num_gpus_per_node = " + std::to_string(s.num_gpus_per_node) + ": must be >= 1");
  }
  if (s.num_nodes < 1) throw std::invalid_argument("num_nodes = " + std::to_string(s.num_nodes) + ": must be >= 1");
  if (!(s.additional_buffer_factor > 0) || !std::isfinite(s.additional_buffer_factor)) {
    throw std::invalid_argument("additional_buffer_factor = " + std::to_string(s.additional_buffer_factor) +
                                ": must be a finite number > 0");
  }
  // The largest quantity any row computes is Ψ · max(4·gpus, 18) · factor bytes; keep it an int64.
  const double largest = static_cast<double>(s.total_params) *
                         std::max(4.0 * static_cast<double>(total_gpus(s)), 18.0) * s.additional_buffer_factor;
  if (largest >= 0x1p62) {
    throw std::invalid_argument("total_params = " + std::to_string(s.total_params) + " on " +
                                std::to_string(total_gpus(s)) + " GPUs: the estimate overflows 64-bit bytes");
  }
}

ZeroEstimateRow estimate_zero2(const ZeroEstimateSetup& s, bool offload_optimizer) {
  validate(s);
  const int64_t p = s.total_params;
  const double abf = s.additional_buffer_factor;
  ZeroEstimateRow row;
  row.stage = 2;
  row.offload_optimizer = offload_optimizer;
  if (offload_optimizer) {
    // The GPU keeps the 16-bit params; each GPU's process holds ≥ 4Ψ on the node's CPU (16Ψ at least in total).
    row.gpu_bytes = 2 * p;
    row.cpu_bytes = truncate(static_cast<double>(p * std::max<int64_t>(4 * total_gpus(s), 16)) * abf);
  } else {
    // 2Ψ 16-bit params whole, plus 18Ψ/N: 16-bit grads, fp32 grads, fp32 master, Adam m and v, partitioned.
    row.gpu_bytes = 2 * p + truncate(static_cast<double>(18 * p) / static_cast<double>(total_gpus(s)));
    // Every process loads the model in fp32 on the CPU before it is moved.
    row.cpu_bytes = truncate(static_cast<double>(p * 4 * s.num_gpus_per_node) * abf);
  }
  return row;
}

ZeroEstimateRow estimate_zero3(const ZeroEstimateSetup& s, bool offload_param, bool offload_optimizer,
                               bool zero_init) {
  validate(s);
  if (offload_param && !offload_optimizer) {
    throw std::invalid_argument("estimate_zero3: offload_param=cpu needs offload_optimizer=cpu (as in DeepSpeed)");
  }
  const int64_t p = s.total_params;
  const int64_t gpus_per_node = s.num_gpus_per_node;
  const double abf = s.additional_buffer_factor;
  const double gpus_factor = 1.0 / s.num_nodes;  // the node's share of the partitioned state
  const int64_t largest_layer_bytes = 4 * s.largest_layer_params;
  const double n = static_cast<double>(total_gpus(s));

  ZeroEstimateRow row;
  row.stage = 3;
  row.offload_param = offload_param;
  row.offload_optimizer = offload_optimizer;
  row.zero_init = zero_init;
  if (offload_optimizer && offload_param) {
    row.gpu_bytes = largest_layer_bytes;
    row.cpu_bytes = zero_init ? truncate(static_cast<double>(p * 18) * gpus_factor * abf)
                              : truncate(times_max(p, 4 * gpus_per_node, 18 * gpus_factor) * abf);
  } else if (offload_optimizer) {
    row.gpu_bytes = largest_layer_bytes + truncate(static_cast<double>(2 * p) / n);
    row.cpu_bytes = zero_init ? truncate(static_cast<double>(p * 16) * gpus_factor * abf)
                              : truncate(times_max(p, 4 * gpus_per_node, 16 * gpus_factor) * abf);
  } else {
    row.gpu_bytes = largest_layer_bytes + truncate(static_cast<double>(18 * p) / n);
    // With zero.Init only one layer is ever whole on the CPU; without it, every process loads the fp32 model.
    row.cpu_bytes = zero_init ? truncate(static_cast<double>(s.largest_layer_params * 4 * gpus_per_node) * abf)
                              : truncate(static_cast<double>(p * 4 * gpus_per_node) * abf);
  }
  // Persistent params stay whole on the GPU in every variant (param offload moves only the partitioned ones).
  row.gpu_bytes += 2 * s.persistent_params;
  return row;
}

std::vector<ZeroEstimateRow> estimate_zero2_rows(const ZeroEstimateSetup& setup) {
  return {estimate_zero2(setup, true), estimate_zero2(setup, false)};
}

std::vector<ZeroEstimateRow> estimate_zero3_rows(const ZeroEstimateSetup& setup) {
  std::vector<ZeroEstimateRow> rows;
  for (bool offload_optimizer : {true, false}) {
    for (bool offload_param : {true, false}) {
      if (offload_param && !offload_optimizer) continue;
      for (bool zero_init : {true, false}) {
        rows.push_back(estimate_zero3(setup, offload_param, offload_optimizer, zero_init));
      }
    }
  }
  return rows;
}

}  // namespace dscpp
