// DeepSpeed's universal checkpoint, written (see deepspeed_export.h). What DeepSpeed reads from each file is in its
// runtime/base_optimizer.py (load_hp_checkpoint_state_from_checkpoint_dir: ZeRO 1 and 2), runtime/zero/stage3.py
// (load_hp_checkpoint_state_from_checkpoint_dir_stage3) and runtime/engine.py (_load_checkpoint: the model states).
#include "dscpp/checkpoint/deepspeed_export.h"

#include <filesystem>

#include "dscpp/checkpoint/checkpoint_dir.h"
#include "dscpp/checkpoint/checkpoint_reader.h"
#include "dscpp/checkpoint/torch_pickle.h"
#include "dscpp/config/config.h"
#include "dscpp/optim/options.h"
#include "dscpp/schedule/lr_schedule.h"

namespace fs = std::filesystem;

namespace dscpp {

namespace {

// The DeepSpeed release whose layout these files follow (its loaders refuse a checkpoint without a version).
constexpr const char* kDeepSpeedLayoutVersion = "0.19.8";

// DeepSpeed restores param group i's hyperparameters from the file's entry i and, at ZeRO 1 and 2, loads the
// optimizer state of only as many of its groups as the file has entries (it zips the two lists). The file cannot know
// the loading script's groups, so it holds this many entries — one dict, pickled once and referenced — each with
// only what the schedule sets (the lr it gives next; OneCycle's betas): every group the script built keeps its own
// weight decay, eps, and, without a schedule, its lr.
constexpr int kParamGroupEntries = 1 << 16;

PyRef torch_size(const std::vector<int64_t>& shape) {
  std::vector<PyRef> dims;
  for (auto d : shape) dims.push_back(py_int(d));
  return py_object("torch.Size", {py_tuple(dims)});
}

// A JSON value (the config, the client state) as the Python value json.loads gives.
PyRef json_to_py(const nlohmann::json& j) {
  if (j.is_null()) return py_none();
  if (j.is_boolean()) return py_bool(j.get<bool>());
  if (j.is_number_integer()) return py_int(j.get<int64_t>());
  if (j.is_number()) return py_float(j.get<double>());
  if (j.is_string()) return py_str(j.get<std::string>());
  if (j.is_array()) {
    std::vector<PyRef> items;
    for (const auto& item : j) items.push_back(json_to_py(item));
    return py_list(items);
  }
  std::vector<std::pair<std::string, PyRef>> entries;
  for (const auto& [key, value] : j.items()) entries.emplace_back(key, json_to_py(value));
  return py_dict(entries);
}

// {"param": tensor, "cat_dim": 0}: a whole parameter's tensor, as ds_to_universal writes it.
void write_param_file(const fs::path& path, torch::Tensor value) {
  save_torch_file(path.string(), *py_dict({{"param", py_tensor(std::move(value))}, {"cat_dim", py_int(0)}}));
}

}  // namespace

DeepSpeedExport write_deepspeed_checkpoint(const std::string& checkpoint_dir, const std::string& tag_arg,
                                           const std::string& out_dir, DeepSpeedLayout layout) {
  const auto tag = resolve_tag(checkpoint_dir, tag_arg);
  CheckpointReader checkpoint((fs::path(checkpoint_dir) / tag).string());
  const Manifest& m = checkpoint.manifest();
  const std::string source = checkpoint.tag_dir() + "/" + kManifestFile;
  if (m.optimizer != "Adam" && m.optimizer != "AdamW") {
    throw CheckpointError(source + ": optimizer " + m.optimizer + "; writing DeepSpeed's layout is supported for "
                          "Adam and AdamW");
  }
  if (m.compute_dtype == "fp16") {
    throw CheckpointError(source + ": an fp16 run; writing DeepSpeed's fp16 loss scaler is not supported yet");
  }
  if (layout == DeepSpeedLayout::kZero0 && m.compute_dtype != "fp32") {
    throw CheckpointError(source + ": a " + m.compute_dtype + " run; DeepSpeed's ZeRO-0 layout is written for fp32 "
                          "runs (a 16-bit run without ZeRO has DeepSpeed's own optimizer wrapper): write the "
                          "universal checkpoint and continue at ZeRO 1-3");
  }
  if (m.pipeline_parallel * m.tensor_parallel != 1) {
    throw CheckpointError(source + ": written by a pipeline- or tensor-parallel run; DeepSpeed's layout for those is "
                          "not written yet");
  }
  // DeepSpeed's universal load restores trainable parameters only (engine.py skips the module state under
  // load_universal): buffers and frozen parameters would silently keep the loading script's initial values.
  if (layout == DeepSpeedLayout::kUniversal && !m.module_state.empty()) {
    const auto& e = m.module_state.front();
    throw CheckpointError(source + ": the model has " + std::to_string(m.module_state.size()) +
                          " buffers or frozen parameters (" + (e.frozen ? "frozen parameter '" : "buffer '") +
                          e.name + "'), which DeepSpeed's universal load does not restore; write its ZeRO-0 layout "
                          "(--zero_stage 0) to continue without ZeRO, as DeepSpeed's per-rank ZeRO 1-3 files are "
                          "not written yet");
  }

  // The run's Adam settings, and the lr the next step runs at: the schedule's after the steps it has applied
  // (LRSchedule's contract).
  ConfigOptions options;
  options.world_size = m.world_size;
  options.warn = [](const std::string&) {};
  const auto config = Config::from_json(m.config, options);
  const AdamOptions* settings = config.optimizer ? std::get_if<AdamOptions>(&config.optimizer->options) : nullptr;
  if (!settings) {
    throw CheckpointError(source + ": the run's config has no Adam / AdamW \"optimizer\" section (a script's own "
                          "optimizer?): its settings, which DeepSpeed's files carry, are not in the checkpoint");
  }
  const AdamOptions& adam = *settings;
  const auto schedule = config.scheduler ? make_lr_schedule(*config.scheduler, adam.lr) : nullptr;
  const double lr = schedule ? schedule->lr_at(m.scheduler_position - 1) : adam.lr;
  // OneCycle cycles beta1 (and sets beta2 0.99) at every step; DeepSpeed's load restores neither.
  const auto scheduled_betas = schedule ? schedule->betas_at(m.scheduler_position - 1) : std::nullopt;
  const Betas group_betas = scheduled_betas.value_or(Betas{adam.betas[0], adam.betas[1]});
  const auto betas = py_tuple({py_float(group_betas.beta1), py_float(group_betas.beta2)});

  prepare_staging(out_dir, tag);
  const fs::path staging = staging_dir(out_dir, tag);
  const fs::path zero = staging / "zero";

  DeepSpeedExport result;
  result.tag = tag;
  std::vector<std::pair<std::string, PyRef>> module, shapes;
  std::vector<PyRef> indices;
  auto state = py_dict({});  // ZeRO 0: torch's optimizer state, by parameter index
  for (const auto& p : m.params) {
    auto read = [&](const std::string& kind) {
      auto out = torch::empty({p.numel()}, torch::kFloat32);
      checkpoint.read_range(kind, p.name, 0, out);
      return out.reshape(p.shape);
    };
    const auto master = read(kMasterKind);
    if (layout == DeepSpeedLayout::kUniversal) {
      const fs::path folder = zero / p.name;
      fs::create_directories(folder);
      write_param_file(folder / "fp32.pt", master);
      for (const auto& kind : m.optimizer_state) write_param_file(folder / (kind + ".pt"), read(kind));
      save_torch_file((folder / "step.pt").string(), *py_int(m.optimizer_step_count));
    } else {
      // DeepSpeed's FusedAdam takes the step of the group's last parameter for all of them: every one holds it.
      std::vector<std::pair<std::string, PyRef>> entries{{"step", py_int(m.optimizer_step_count)}};
      for (const auto& kind : m.optimizer_state) entries.emplace_back(kind, py_tensor(read(kind)));
      const auto index = static_cast<int64_t>(indices.size());
      state->entries.emplace_back(py_int(index), py_dict(entries));
      indices.push_back(py_int(index));
    }
    module.emplace_back(p.name, py_tensor(master));
    shapes.emplace_back(p.name, torch_size(p.shape));
    ++result.parameters;
    result.elements += p.numel();
  }
  std::vector<PyRef> buffer_names;
  std::vector<std::pair<std::string, PyRef>> frozen_shapes;
  for (const auto& e : m.module_state) {
    module.emplace_back(e.name, py_tensor(checkpoint.read(e.rank, shard_tensor_name(kModuleKind, e.name))));
    if (e.frozen) {
      frozen_shapes.emplace_back(e.name, torch_size(e.shape));
    } else {
      buffer_names.push_back(py_str(e.name));
    }
  }

  PyRef optimizer = py_none();
  if (layout == DeepSpeedLayout::kUniversal) {
    // zero/optimizer_state.pt: the loss scaler, clipping and version every stage's loader checks, and the lr (ZeRO 1
    // and 2 read param_groups; ZeRO 3 optimizer_state_dict, with the step).
    auto scaler = py_object("deepspeed.runtime.fp16.loss_scaler.LossScaler", {},
                            py_dict({{"cur_scale", py_float(m.loss_scaler.scale)}, {"dynamic", py_bool(false)}}));
    std::vector<std::pair<std::string, PyRef>> scheduled;
    if (schedule) scheduled.emplace_back("lr", py_float(lr));
    if (scheduled_betas) scheduled.emplace_back("betas", betas);
    const std::vector<PyRef> groups(kParamGroupEntries, py_dict(scheduled));
    auto step_state = py_dict({});
    step_state->entries.emplace_back(py_int(0), py_dict({{"step", py_int(m.optimizer_step_count)}}));
    save_torch_file((zero / "optimizer_state.pt").string(),
                    *py_dict({{"loss_scaler", scaler},
                              {"dynamic_loss_scale", py_bool(false)},
                              {"overflow", py_bool(false)},
                              {"clip_grad", py_float(config.gradient_clipping)},
                              {"ds_version", py_str(kDeepSpeedLayoutVersion)},
                              {"zero_stage", py_object("deepspeed.runtime.zero.config.ZeroStageEnum",
                                                       {py_int(m.zero_stage)})},
                              {"partition_count", py_int(m.world_size)},
                              {"param_groups", py_list(groups)},
                              {"optimizer_state_dict",
                               py_dict({{"state", step_state}, {"param_groups", py_list({groups[0]})}})}}));
  } else {
    // torch's Optimizer.state_dict() of DeepSpeed's FusedAdam over one param group of the module's parameters in
    // order (load_state_dict restores every group key from it, so all of FusedAdam's are here).
    optimizer = py_dict(
        {{"state", state},
         {"param_groups",
          py_list({py_dict({{"lr", py_float(lr)},
                            {"bias_correction", py_bool(adam.bias_correction)},
                            {"betas", betas},
                            {"eps", py_float(adam.eps)},
                            {"weight_decay", py_float(adam.weight_decay)},
                            {"step", py_int(0)},
                            {"params", py_list(indices)}})})}});
  }

  // The model states: the weights (whole; ZeRO 3 takes them from the folders above), where training stood, the
  // schedule's position (DeepSpeed counts last_batch_iteration from -1) and the client state. The universal
  // checkpoint has the same file under the name ZeRO 1/2 loads and the name ZeRO 3 loads.
  std::vector<std::pair<std::string, PyRef>> states = {
      {"module", py_dict(module)},
      {"buffer_names", py_list(buffer_names)},
      {"optimizer", optimizer},
      {"param_shapes", py_list({py_dict(shapes)})},
      {"frozen_param_shapes", frozen_shapes.empty() ? py_none() : py_dict(frozen_shapes)},
      {"shared_params", py_dict({})},
      {"frozen_param_fragments", py_none()},
      {"lr_scheduler", config.scheduler ? py_dict({{"last_batch_iteration", py_int(m.scheduler_position - 1)}})
                                        : py_none()},
      {"data_sampler", py_none()},
      {"random_ltd", py_none()},
      {"skipped_steps", py_int(m.skipped_steps)},
      {"global_steps", py_int(m.global_steps)},
      {"global_samples", py_int(m.global_samples)},
      {"dp_world_size", py_int(m.world_size)},
      {"mp_world_size", py_int(1)},
      {"ds_config", json_to_py(m.config)},
      {"ds_version", py_str(kDeepSpeedLayoutVersion)},
  };
  if (m.client_state.is_object()) {
    for (const auto& [key, value] : m.client_state.items()) states.emplace_back(key, json_to_py(value));
  }
  const auto model_states = py_dict(states);
  save_torch_file((staging / "mp_rank_00_model_states.pt").string(), *model_states);
  if (layout == DeepSpeedLayout::kUniversal) {
    save_torch_file((staging / "zero_pp_rank_0_mp_rank_00_model_states.pt").string(), *model_states);
  }

  publish_staging(out_dir, tag);
  if (layout == DeepSpeedLayout::kUniversal) write_file_durably((fs::path(out_dir) / "latest_universal").string(), tag);
  write_latest(out_dir, tag);
  return result;
}

}  // namespace dscpp
