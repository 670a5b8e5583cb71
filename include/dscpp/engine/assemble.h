// assemble: the config and the program's options turned into the engine's parts, once, before the first step — the
// one place that branches on config values (which stage, which optimizer kernels, where the optimizer step runs,
// which scaler and schedule), so the step itself never does. In order: the model split into what is trained and
// what is kept (cast to the compute dtype), the device and the data-parallel group, the parallel layout, the ZeRO
// stage, the optimizer and where its step runs, the schedule, the scaler, activation checkpointing, the observer.
// Engine (engine.h) only sequences what this returns.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/activation/checkpointing.h"
#include "dscpp/checkpoint/manifest.h"
#include "dscpp/config/config.h"
#include "dscpp/engine/checkpointer.h"
#include "dscpp/engine/init_options.h"
#include "dscpp/engine/model_tensors.h"
#include "dscpp/engine/optimizer_step.h"
#include "dscpp/engine/parallel_layout.h"
#include "dscpp/engine/step_observer.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/precision/loss_scaler.h"
#include "dscpp/schedule/lr_schedule.h"
#include "dscpp/zero/flat_params.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

// The model as the engine holds it once assembled.
struct EngineModel {
  std::shared_ptr<torch::nn::Module> module;          // a LibTorch model, kept alive; null for ModelTensors
  std::map<const torch::nn::Module*, int> unit_of;    // a LibTorch model's gather units: index in the units
  std::vector<std::string> unit_names;                // per gather unit, for the flops profiler's scopes
  std::vector<ParamEntry> params;                     // the trainable parameters' names and shapes, in order
  std::vector<CheckpointedState::ModuleTensor> module_state;  // frozen parameters and buffers, named
  torch::ScalarType dtype = torch::kFloat32;          // the compute dtype
  torch::Device device{torch::kCPU};                  // where the parameters (and so training) live
  bool forward_only = false;                          // InitOptions::forward_only took effect: no backward, no step
};

struct EngineParts {
  Config config;
  EngineModel model;
  std::unique_ptr<ParallelLayout> layout;
  std::unique_ptr<StepObserver> observer;
  std::unique_ptr<FlatParams> flat;  // stages 0-2: every parameter as a view of one buffer; stage 3 has none
  std::unique_ptr<ZeroStage> stage;
  std::unique_ptr<FlatOptimizer> optimizer;
  std::unique_ptr<OptimizerStep> optimizer_step;
  std::unique_ptr<LRSchedule> schedule;
  std::unique_ptr<LossScaler> scaler;
  std::unique_ptr<ActivationCheckpointing> checkpointing;
};

// A LibTorch module: its tensors, the gather units InitOptions names, a model built partitioned, the experts its
// MoE layers name. The parallel layout comes from InitOptions' groups.
EngineParts assemble(std::shared_ptr<torch::nn::Module> module, Config config, InitOptions options);
// The same with the layout's groups and names given by whoever splits the model (PipelineEngine, one engine per
// stage); InitOptions' own group fields must then be empty (std::invalid_argument naming the field).
EngineParts assemble(std::shared_ptr<torch::nn::Module> module, Config config, InitOptions options,
                     ParallelLayout::Groups groups, ParallelLayout::Names names);
// Any model given as its tensors (the Python front end's way in); InitOptions::gather_units and ::partitioned must be
// empty, they name LibTorch modules.
EngineParts assemble(ModelTensors model, Config config, InitOptions options);

}  // namespace dscpp
