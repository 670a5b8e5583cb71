// What deepspeed_export.cpp (the universal and ZeRO-0 layouts, the model states) and deepspeed_zero_export.cpp
// (DeepSpeed's partitioned ZeRO 1-3 files) share: our checkpoint read whole, and the pickled values both write.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dscpp/checkpoint/manifest.h"
#include "dscpp/checkpoint/torch_pickle.h"

namespace dscpp::deepspeed_export {

// The DeepSpeed release whose layout these files follow (its loaders refuse a checkpoint without a version).
constexpr const char* kDeepSpeedVersion = "0.19.8";

// One run, read whole from our checkpoint: every layout writes a view of it.
struct WholeRun {
  const Manifest* manifest = nullptr;
  std::vector<torch::Tensor> master;                        // by manifest->params: fp32, in the parameter's shape
  std::map<std::string, std::vector<torch::Tensor>> state;  // optimizer state kind (exp_avg, ...) -> by params
  std::vector<torch::Tensor> module_state;                  // by manifest->module_state, as saved
  torch::ScalarType compute_dtype = torch::kFloat32;        // the module's dtype in DeepSpeed (fp32 or bf16)
  double clip_grad = 0.0;                                   // the config's gradient_clipping
  int64_t sub_group_size = 0;                               // the config's zero_optimization.sub_group_size
  // Torch's param group of DeepSpeed's Adam, without "params": the settings and the lr (and OneCycle's betas) of
  // the next step, which DeepSpeed's load puts into the optimizer in place of the script's.
  PyRef adam_group;
};

// A JSON value (the config, the client state) as the Python value json.loads gives.
PyRef json_to_py(const nlohmann::json& j);
PyRef torch_size(const std::vector<int64_t>& shape);
// The loss scaler DeepSpeed pickles for a run without fp16: a static LossScaler of scale 1.
PyRef static_loss_scaler();
PyRef zero_stage_enum(int stage);
// Torch's Optimizer.state_dict() of DeepSpeed's Adam over one param group whose tensors have `states` (by index;
// each {"step", "exp_avg", "exp_avg_sq"}).
PyRef adam_state_dict(const WholeRun& run, const std::vector<PyRef>& states);
// One tensor's Adam state: the step, and each moment's values (in the manifest's optimizer_state order).
PyRef adam_tensor_state(const WholeRun& run, const std::vector<torch::Tensor>& moments);

// The module's state_dict, whole: the trainable parameters (in `dtype`), then the buffers and frozen parameters as
// saved.
PyRef whole_module(const WholeRun& run, torch::ScalarType dtype);

// What one layout's model-states file holds besides the counters every layout writes.
struct ModelStatesParts {
  PyRef module;                        // the module's state_dict
  PyRef optimizer;                     // ZeRO 0: the optimizer's state_dict; null: None (ZeRO keeps it elsewhere)
  // From ZeRO 2 on DeepSpeed saves the frozen parameters' shapes and this rank's fragment of each ({name: tensor},
  // possibly empty); null: neither (ZeRO 0 and 1, where the module holds them whole).
  PyRef frozen_fragments;
  // Where each of param_shapes' dicts ends in the trainable parameters: one per ZeRO-3 sub-group (DeepSpeed's tools
  // pair them with the optimizer's flat groups); empty: one dict.
  std::vector<size_t> shape_groups_end;
  int dp_world_size = 1;
};

// The model-states dict DeepSpeed writes (engine.py's _common_checkpoint_state), with the counters, the schedule's
// position and the client state.
PyRef model_states(const WholeRun& run, const ModelStatesParts& parts);

// DeepSpeed's files of a run at ZeRO `stage` (1-3) on `world` data-parallel ranks, written into `tag_dir`: at 1 and 2
// the model states and each rank's partition of the one param group's flat fp32 buffer and moments, at 3 each
// rank's model states and its pieces of every parameter. Returns the number of files written.
int64_t write_zero_partitions(const WholeRun& run, int stage, int world, const std::filesystem::path& tag_dir);

}  // namespace dscpp::deepspeed_export
