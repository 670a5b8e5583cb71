// The 1-bit optimizers: DeepSpeed's OnebitAdam, ZeroOneAdam and OnebitLamb (deepspeed/runtime/fp16/onebit/ of
// DeepSpeed 0.19.6, the last release that ships them) as FlatOptimizers over stage 0's whole flat master. Unlike the
// others they talk to the data-parallel ranks themselves, through the error-compensated 1-bit all-reduce
// (comm/compressed_allreduce.h), and tell the engine which steps want averaged gradients
// (FlatOptimizer::wants_local_gradients): on the others each rank keeps its own and the optimizer averages what it
// needs, compressed. Steps count from 1, as DeepSpeed's.
//
// OneBitAdam (Tang et al. 2021):
//   step 1        DeepSpeed's set-up step: nothing is updated.
//   2 .. W        warm-up, W = max(freeze_step, 2): Adam without bias correction on averaged gradients:
//                 m = β1·m + (1−β1)·g, v = β2·v + (1−β2)·g², p −= lr·(m / (√v + ε) + wd·p).
//   W+1 ..        v frozen; each rank folds its own gradient into m, m is averaged compressed (1/32 of the bytes),
//                 and p moves as above.
//
// ZeroOneAdam (Lu et al. 2022):
//   step 1        the set-up step.
//   2 .. F+1      F = var_freeze_step: on steps that are multiples of var_interval (1 at first, doubled each
//                 var_update_scaler such steps) m and v from averaged gradients; on the others m from the gradients
//                 averaged compressed. p moves as 1-bit Adam's.
//   F+2 ..        v frozen, and no communication on most steps: each rank moves p by its own gradient's m, and every
//                 local_step_interval steps (1 at first, doubled each local_step_scaler steps up to
//                 local_step_clipper) the updates since the last sync are averaged compressed, from which p and m
//                 are set on every rank. Between syncs each rank's p differs: a checkpoint taken there keeps each
//                 rank's own part of the weights (with the default local_step_scaler, 32,678 steps of interval 1
//                 come first, each a sync).
//
// OneBitLamb (Li et al. 2021), per parameter tensor (FlatOptimizer::partition_tensors), no bias correction:
//   step 1        the set-up step.
//   2 .. W        warm-up, W = max(freeze_step, 2): LAMB on averaged gradients, u = m / (√v + ε) + wd·p,
//                 ratio = clamp(‖p‖ / ‖u‖, min_coeff, max_coeff), p −= lr·ratio·u; each ratio ≠ 1 also averaged into
//                 the tensor's frozen ratio (coeff_beta); at step freeze_step a copy of v starts the fresh variance.
//   W+1 ..        v frozen; each tensor's m is scaled to the tensors' mean RMS (once, at the first such step), each
//                 rank folds in its own gradient, m is averaged compressed and unscaled. The gradient it implies
//                 updates the fresh variance v′, and the tensor moves by lr·frozen ratio·factor·u, factor =
//                 max((√v + ε) / (√v′ + ε)) (mixed towards 1 by weight decay's share of u), clamped to
//                 [factor_min, factor_max] and to within factor_threshold of the last step's.
//
// What differs from DeepSpeed, on purpose:
//   - The whole partition is one compressed buffer (DeepSpeed's fp16 optimizer hands its 1-bit optimizer one
//     flattened buffer per parameter group; in fp32 DeepSpeed compresses each parameter apart), so a run with
//     parameter groups scales its signs over all of them at once.
//   - 0/1 Adam's synchronisation sets p from the anchor (zero_one_adam.cpp says why), and a resumed 0/1 Adam replays
//     its interval counters from the step count where DeepSpeed's restarts them.
//   - 1-bit LAMB's per-tensor coefficients are replicated_state(), resumed as saved at any world size (DeepSpeed's
//     restarts them when resuming in the warm-up), and a tensor whose momentum is zero gets the scaling 1 (DeepSpeed's
//     divides by its zero norm).
//   - A resumed run steps on from the checkpoint's step count: none of the three repeats DeepSpeed's set-up step (a
//     resumed DeepSpeed optimizer starts uninitialised, and spends its first step setting up again).
// The error feedback is rank_state(): a resumed run of the same world size continues exactly; one of another world
// size starts it at zero, as every DeepSpeed resume does. On one rank nothing is compressed (DeepSpeed's size-1 rule:
// 0/1 Adam then leaves m unchanged on its compressed-gradient steps, as DeepSpeed's does).
//
// All are stepped whole only (step()): their collectives span the partition, which no sliced caller (offload,
// begin_step + update) could run; ZeRO, which offload needs, is refused with them.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "dscpp/comm/comm.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/optim/options.h"

namespace dscpp {

// Whether `config` names a 1-bit optimizer (OneBitAdam, ZeroOneAdam, OneBitLamb): one make_onebit_optimizer builds.
bool is_onebit_optimizer(const OptimizerConfig& config);

// `comm`: the data-parallel ranks the optimizer averages over (every rank holds the whole partition: stage 0).
// std::invalid_argument naming the option for values DeepSpeed's would not take, or for another optimizer type.
std::unique_ptr<FlatOptimizer> make_onebit_optimizer(const OptimizerConfig& config, int64_t numel,
                                                     const torch::TensorOptions& state_options,
                                                     std::shared_ptr<Comm> comm);

}  // namespace dscpp
