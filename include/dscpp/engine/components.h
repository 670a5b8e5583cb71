// The engine's parts built from the config: the one place that turns config values into types
// (which stage, which scaler, which dtype), so the training step itself never branches on them.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "dscpp/config/config.h"
#include "dscpp/config/support.h"
#include "dscpp/offload/state_store.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/precision/loss_scaler.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

torch::ScalarType to_scalar_type(DType dtype);

// fp16 → static or dynamic scaler; fp32/bf16 → the unit scaler that stops on non-finite gradients.
std::unique_ptr<LossScaler> make_loss_scaler(const Config& config, std::function<void(const std::string&)> log);

// Stages 0-2 over the engine's FlatParams (context.flat).
std::unique_ptr<ZeroStage> make_zero_stage(const ZeroConfig& zero, const StageContext& context);

// Where offload_optimizer keeps `stage`'s master and `optimizer`'s state: in host memory ("cpu": the stage's master
// and the optimizer's own tensors), or in rank `rank`'s swap file under nvme_path ("nvme": seeded from the stage's
// master and fresh state, after which the stage's copy is released; `optimizer` was built for 0 elements).
std::unique_ptr<StateStore> make_optimizer_store(const Config& config, ZeroStage& stage, FlatOptimizer& optimizer,
                                                 int rank);

// offload_param (stage 3): the 16-bit partition in host memory ("cpu") or in rank `rank`'s swap file under the
// section's nvme_path ("nvme").
void set_param_offload(const Config& config, int rank, StageContext& context);

// DeepSpeed's gradient averaging: with prescale_gradients the gradients are divided by the world size before the
// sum over ranks; otherwise by gradient_predivide_factor f before and multiplied by f / world_size after.
void set_gradient_averaging(const Config& config, int world_size, StageContext& context);

}  // namespace dscpp
