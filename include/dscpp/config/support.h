// What this engine can run: the one check of a parsed Config against the features deepspeed.cpp has, made by
// Config::from_json itself so that `dscpp plan`, `dscpp estimate` and dscpp::initialize refuse exactly the same
// configs (issue 17). Torch-free, like the rest of the config layer.
#pragma once

#include "dscpp/config/config.h"

namespace dscpp {

// The dtype gradients are summed over micro-steps in, for this config: the compute dtype in the whole-model
// gradient buffer at stages 0-1; the reduced shard at stages 2-3, in the communication dtype (fp32 when the
// optimizer is offloaded, as DeepSpeed keeps it for the CPU optimizer).
DType gradient_accumulation_dtype(const Config& config);

// Throws ConfigError naming the key for every setting DeepSpeed accepts that this engine does not support yet
// (offload at stage 0, partial offload, fp16.auto_cast, wandb, round_robin_gradients, Lamb offloaded, a
// grad_accum_dtype other than the one this config accumulates in), and for the optimizer combinations DeepSpeed
// refuses (Lamb and 1-bit LAMB with a static loss scale, the 1-bit optimizers with ZeRO).
void check_supported(const Config& config);

}  // namespace dscpp
