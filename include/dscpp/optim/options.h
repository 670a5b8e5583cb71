// Optimizer options: plain values with DeepSpeed's defaults, parsed from the config's "optimizer" section.
// Torch-free on purpose: the config layer depends on these, and it must not pull in LibTorch.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <variant>

namespace dscpp {

// Adam and AdamW (DeepSpeed's FusedAdam / torch.optim.AdamW semantics).
// DeepSpeed quirk kept on purpose: for "type": "Adam" the decay is decoupled (AdamW) unless
// "adam_w_mode": false, because DeepSpeed's ADAM_W_MODE_DEFAULT is true.
struct AdamOptions {
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool adam_w_mode = true;       // decoupled weight decay (AdamW); false: L2 added to the gradient
  bool bias_correction = true;
  bool torch_adam = false;       // accepted for compatibility; our flat Adam is used either way
  bool amsgrad = false;          // torch.optim.Adam(W)'s AMSGrad: the denominator uses max over steps of v
};

// torch.optim.SGD semantics.
struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;         // requires momentum > 0 and dampening == 0
};

// Lion (Chen et al. 2023; DeepSpeed FusedLion): decoupled weight decay.
struct LionOptions {
  double lr = 1e-4;
  std::array<double, 2> betas{0.9, 0.99};
  double weight_decay = 0.0;
};

// torch.optim.Adagrad semantics (DeepSpeed's CPU Adagrad uses the same defaults).
struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
};

// DeepSpeed's Lamb (You et al. 2020; its FusedLamb, deepspeed/ops/lamb/fused_lamb.py and
// csrc/lamb/fused_lamb_cuda_kernel.cu): Adam's moments, then each parameter tensor moves by its update scaled by the
// trust ratio ||p|| / ||update||, clamped to [min_coeff, max_coeff] (1 where either norm is 0). The ratio is taken
// on the update before bias correction; bias correction scales the step: lr·√(1−β2^t)/(1−β1^t).
struct LambOptions {
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;  // added to the update (w·p) before the trust ratio, as DeepSpeed's kernel does
  bool bias_correction = true;
  bool eps_inside_sqrt = false;  // √(v + ε) instead of √v + ε
  double max_coeff = 10.0;
  double min_coeff = 0.01;
};

// DeepSpeed's OnebitAdam (Tang et al. 2021, "1-bit Adam"; deepspeed/runtime/fp16/onebit/adam.py of DeepSpeed 0.19.6,
// the last release that ships it): Adam without bias correction on averaged gradients for `freeze_step` steps, then
// the variance frozen and the momentum averaged over the data-parallel ranks by the error-compensated 1-bit
// all-reduce (comm/compressed_allreduce.h) instead of the gradients. Weight decay is decoupled (added to the update).
struct OneBitAdamOptions {
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t freeze_step = 100000;  // steps before compression starts (DeepSpeed's default)
  // How DeepSpeed reaches its compressed backend. Ours is the engine's comm (c10d: NCCL on GPUs, Gloo on CPUs)
  // whichever of "nccl" and "compressed" is named; "mpi" and "hccl" are refused. `cuda_aware` matters to MPI only.
  std::string comm_backend_name = "nccl";
  bool cuda_aware = false;
};

// DeepSpeed's ZeroOneAdam (Lu et al. 2022, "0/1 Adam"; deepspeed/runtime/fp16/onebit/zoadam.py of DeepSpeed 0.19.6):
// the variance updated from averaged gradients on steps spaced ever further apart (every var_interval, doubled each
// var_update_scaler updates) and the momentum from 1-bit compressed gradients between them, until var_freeze_step;
// then the variance frozen, each rank stepping on its own for local_step_interval steps (doubled every
// local_step_scaler steps, up to local_step_clipper) before the accumulated updates are averaged, 1-bit compressed.
struct ZeroOneAdamOptions {
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t var_freeze_step = 100000;
  int64_t var_update_scaler = 16;
  int64_t local_step_scaler = 32678;  // DeepSpeed's default, as it spells it
  int64_t local_step_clipper = 16;
  std::string comm_backend_name = "nccl";  // as OneBitAdamOptions
  bool cuda_aware = false;
};

// DeepSpeed's OnebitLamb (Li et al. 2021, "1-bit LAMB"; deepspeed/runtime/fp16/onebit/lamb.py of DeepSpeed 0.19.6):
// LAMB without bias correction on averaged gradients for `freeze_step` steps, each tensor's trust ratio also
// averaged (coeff_beta) into a frozen one; then the variance frozen, the momentum averaged by the 1-bit all-reduce
// (each tensor's momentum scaled to one common magnitude first), and each tensor's step the frozen ratio times a
// factor from a fresh variance estimate, clamped to [factor_min, factor_max] and to ±factor_threshold of the last.
struct OneBitLambOptions {
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t freeze_step = 100000;
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  double coeff_beta = 0.9;
  double factor_max = 4.0;
  double factor_min = 0.5;
  double factor_threshold = 0.1;
  std::string comm_backend_name = "nccl";  // as OneBitAdamOptions
  bool cuda_aware = false;
};

using OptimizerOptions = std::variant<AdamOptions, SgdOptions, LionOptions, AdagradOptions, LambOptions,
                                      OneBitAdamOptions, ZeroOneAdamOptions, OneBitLambOptions>;

// "Adam", "AdamW", "SGD", "Lion", "Adagrad", "Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb" as DeepSpeed spells
// them (matched case-insensitively).
struct OptimizerConfig {
  std::string type;              // canonical spelling, e.g. "AdamW"
  OptimizerOptions options;

  // The configured base lr, whatever the type.
  double lr() const {
    return std::visit([](const auto& o) { return o.lr; }, options);
  }
};

}  // namespace dscpp
