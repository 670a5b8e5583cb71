// FLOPs (DeepSpeed's flops_profiler): the floating-point operations of a model's forward, counted from the LibTorch
// ops it runs rather than from a formula, attributed to the module scope they ran in, and what fraction of the
// machine's peak a step achieved (MFU).
//
// A FlopsCounter observes the ops its thread runs while it lives (ATen's RecordFunction callbacks) and counts the
// ones that carry a model's arithmetic: matrix products (mm, addmm, bmm, baddbmm, their fused attention kernels) at
// 2 FLOPs per multiply-add. Elementwise ops, norms and softmax are not counted, as in most MFU accounting; a
// composite op (linear, matmul) counts through the product it runs, once.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>

namespace dscpp {

class FlopsCounter {
 public:
  FlopsCounter();   // starts counting this thread's ops
  ~FlopsCounter();  // stops
  FlopsCounter(const FlopsCounter&) = delete;
  FlopsCounter& operator=(const FlopsCounter&) = delete;

  int64_t total() const { return total_; }
  const std::map<std::string, int64_t>& by_module() const { return by_module_; }  // innermost Scope's name → FLOPs
  const std::map<std::string, int64_t>& by_op() const { return by_op_; }          // "aten::mm" → FLOPs

  // Attributes the ops run while it lives to `name` (nesting: the innermost wins). Free when nothing counts.
  class Scope {
   public:
    explicit Scope(std::string name);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
  };

  // Called by the op observer.
  void add(const std::string& op, int64_t flops);

 private:
  uint64_t handle_;
  FlopsCounter* previous_;  // a counter this one nests in, restored when it ends
  int64_t total_ = 0;
  std::map<std::string, int64_t> by_module_;
  std::map<std::string, int64_t> by_op_;
};

// One profiled optimizer step of this rank (flops_profiler.profile_step).
struct FlopsProfile {
  int64_t step = 0;
  int64_t micro_steps = 0;
  int64_t forward_flops = 0;   // the step's forwards, all micro-steps
  double recompute_fwd_factor = 0;
  double step_s = 0;           // forward + backward + step
  double peak_flops = 0;       // measured: FLOP/s of a matmul in the compute dtype on this device
  std::map<std::string, int64_t> by_module, by_op;

  // DeepSpeed's convention: backward = 2 × forward, plus the recomputed forwards.
  double step_flops() const { return forward_flops * (3.0 + recompute_fwd_factor); }
  double achieved() const { return step_s > 0 ? step_flops() / step_s : 0; }
  double mfu() const { return peak_flops > 0 ? achieved() / peak_flops : 0; }
};

// The profile as printed: totals, achieved FLOP/s and MFU, the `top_modules` largest module scopes (names cut to
// `module_depth` dotted parts when > 0), and with `detailed` the split by op.
std::string describe(const FlopsProfile& profile, int top_modules, int module_depth, bool detailed);

// The matrix-product FLOPs of one op given its input shapes, or 0 for ops that are not counted.
int64_t matmul_flops(const std::string& op, const std::vector<std::vector<int64_t>>& input_shapes);

// The best FLOP/s of a square `dtype` matmul on `device` over about `seconds`: the peak MFU is measured against
// where none is given.
double measure_peak_flops(torch::ScalarType dtype, const torch::Device& device, double seconds = 0.5);

// "12.3 GFLOP", "45.6 TFLOP/s" (suffix as given).
std::string format_flops(double flops, const std::string& suffix = "FLOP");

}  // namespace dscpp
