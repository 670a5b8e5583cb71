// DeepSpeed's universal checkpoint and its ZeRO-0 layout, written (see deepspeed_export.h); its partitioned ZeRO 1-3
// files are deepspeed_zero_export.cpp's. What DeepSpeed reads from each file is in its runtime/base_optimizer.py
// (load_hp_checkpoint_state_from_checkpoint_dir: ZeRO 1 and 2), runtime/zero/stage3.py
// (load_hp_checkpoint_state_from_checkpoint_dir_stage3) and runtime/engine.py (_load_checkpoint: the model states).
#include "dscpp/checkpoint/deepspeed_export.h"

#include <filesystem>
#include <stdexcept>

#include "deepspeed_export_internal.h"
#include "dscpp/checkpoint/checkpoint_dir.h"
#include "dscpp/checkpoint/checkpoint_reader.h"
#include "dscpp/checkpoint/torch_pickle.h"
#include "dscpp/config/config.h"
#include "dscpp/optim/options.h"
#include "dscpp/schedule/lr_schedule.h"

namespace fs = std::filesystem;

namespace dscpp {
namespace deepspeed_export {

namespace {

// DeepSpeed restores param group i's hyperparameters from the file's entry i and, at ZeRO 1 and 2, loads the
// optimizer state of only as many of its groups as the file has entries (it zips the two lists). The file cannot know
// the loading script's groups, so it holds this many entries — one dict, pickled once and referenced — each with
// only what the schedule sets (the lr it gives next; OneCycle's betas): every group the script built keeps its own
// weight decay, eps, and, without a schedule, its lr.
constexpr int kParamGroupEntries = 1 << 16;

// {"param": tensor, "cat_dim": 0}: a whole parameter's tensor, as ds_to_universal writes it.
void write_param_file(const fs::path& path, torch::Tensor value) {
  save_torch_file(path.string(), *py_dict({{"param", py_tensor(std::move(value))}, {"cat_dim", py_int(0)}}));
}

// ds_to_universal's layout: zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt and zero/optimizer_state.pt, beside the
// model states under both names (ZeRO 1/2 load mp_rank_00_…, ZeRO 3 zero_pp_rank_0_…).
int64_t write_universal(const WholeRun& run, const PyRef& lr_and_betas, const fs::path& tag_dir) {
  const Manifest& m = *run.manifest;
  const fs::path zero = tag_dir / "zero";
  int64_t files = 0;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const fs::path folder = zero / m.params[i].name;
    fs::create_directories(folder);
    write_param_file(folder / "fp32.pt", run.master[i]);
    for (const auto& kind : m.optimizer_state) write_param_file(folder / (kind + ".pt"), run.state.at(kind)[i]);
    save_torch_file((folder / "step.pt").string(), *py_int(m.optimizer_step_count));
    files += 2 + static_cast<int64_t>(m.optimizer_state.size());
  }
  // The loss scaler, clipping and version every stage's loader checks, and the lr (ZeRO 1 and 2 read param_groups;
  // ZeRO 3 optimizer_state_dict, with the step).
  const std::vector<PyRef> groups(kParamGroupEntries, lr_and_betas);
  auto step_state = py_dict({});
  step_state->entries.emplace_back(py_int(0), py_dict({{"step", py_int(m.optimizer_step_count)}}));
  save_torch_file((zero / "optimizer_state.pt").string(),
                  *py_dict({{"loss_scaler", static_loss_scaler()},
                            {"dynamic_loss_scale", py_bool(false)},
                            {"overflow", py_bool(false)},
                            {"clip_grad", py_float(run.clip_grad)},
                            {"ds_version", py_str(kDeepSpeedVersion)},
                            {"zero_stage", zero_stage_enum(m.zero_stage)},
                            {"partition_count", py_int(m.world_size)},
                            {"param_groups", py_list(groups)},
                            {"optimizer_state_dict",
                             py_dict({{"state", step_state}, {"param_groups", py_list({groups[0]})}})}}));
  const auto states = model_states(run, {whole_module(run, torch::kFloat32), nullptr, nullptr, {}, m.world_size});
  save_torch_file((tag_dir / "mp_rank_00_model_states.pt").string(), *states);
  save_torch_file((tag_dir / "zero_pp_rank_0_mp_rank_00_model_states.pt").string(), *states);
  return files + 3;
}

// ZeRO 0 (fp32): one model-states file holding the whole module and torch's state_dict of DeepSpeed's FusedAdam over
// one param group of the trainable parameters in order.
int64_t write_zero0(const WholeRun& run, int world, const fs::path& tag_dir) {
  const Manifest& m = *run.manifest;
  std::vector<PyRef> states;
  for (size_t i = 0; i < m.params.size(); ++i) {
    std::vector<torch::Tensor> moments;
    for (const auto& kind : m.optimizer_state) moments.push_back(run.state.at(kind)[i]);
    states.push_back(adam_tensor_state(run, moments));
  }
  save_torch_file((tag_dir / "mp_rank_00_model_states.pt").string(),
                  *model_states(run, {whole_module(run, torch::kFloat32), adam_state_dict(run, states), nullptr, {},
                                      world}));
  return 1;
}

}  // namespace

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

PyRef whole_module(const WholeRun& run, torch::ScalarType dtype) {
  const Manifest& m = *run.manifest;
  std::vector<std::pair<std::string, PyRef>> module;
  for (size_t i = 0; i < m.params.size(); ++i) {
    module.emplace_back(m.params[i].name, py_tensor(run.master[i].to(dtype)));
  }
  for (size_t i = 0; i < m.module_state.size(); ++i) {
    module.emplace_back(m.module_state[i].name, py_tensor(run.module_state[i]));
  }
  return py_dict(module);
}

PyRef torch_size(const std::vector<int64_t>& shape) {
  std::vector<PyRef> dims;
  for (auto d : shape) dims.push_back(py_int(d));
  return py_object("torch.Size", {py_tuple(dims)});
}

PyRef static_loss_scaler() {
  return py_object("deepspeed.runtime.fp16.loss_scaler.LossScaler", {},
                   py_dict({{"cur_scale", py_float(1.0)}, {"dynamic", py_bool(false)}}));
}

PyRef zero_stage_enum(int stage) {
  return py_object("deepspeed.runtime.zero.config.ZeroStageEnum", {py_int(stage)});
}

PyRef adam_tensor_state(const WholeRun& run, const std::vector<torch::Tensor>& moments) {
  // An int step: DeepSpeed's FusedAdam keeps one; torch's Adam(W) turns it into its tensor at load_state_dict.
  std::vector<std::pair<std::string, PyRef>> entries{{"step", py_int(run.manifest->optimizer_step_count)}};
  for (size_t k = 0; k < moments.size(); ++k) {
    entries.emplace_back(run.manifest->optimizer_state[k], py_tensor(moments[k]));
  }
  return py_dict(entries);
}

PyRef adam_state_dict(const WholeRun& run, const std::vector<PyRef>& states) {
  auto state = py_dict({});
  std::vector<PyRef> indices;
  for (size_t i = 0; i < states.size(); ++i) {
    state->entries.emplace_back(py_int(static_cast<int64_t>(i)), states[i]);
    indices.push_back(py_int(static_cast<int64_t>(i)));
  }
  auto group = std::make_shared<PyValue>(*run.adam_group);
  group->entries.emplace_back(py_str("params"), py_list(indices));
  return py_dict({{"state", state}, {"param_groups", py_list({group})}});
}

PyRef model_states(const WholeRun& run, const ModelStatesParts& parts) {
  const Manifest& m = *run.manifest;
  std::vector<PyRef> shape_groups;
  std::vector<std::pair<std::string, PyRef>> shapes;
  std::vector<size_t> ends = parts.shape_groups_end;
  if (ends.empty()) ends.push_back(m.params.size());
  for (size_t i = 0, group = 0; i < m.params.size(); ++i) {
    shapes.emplace_back(m.params[i].name, torch_size(m.params[i].shape));
    if (i + 1 == ends[group]) {
      shape_groups.push_back(py_dict(shapes));
      shapes.clear();
      ++group;
    }
  }
  std::vector<PyRef> buffer_names;
  std::vector<std::pair<std::string, PyRef>> frozen_shapes;
  for (const auto& e : m.module_state) {
    if (e.frozen) {
      frozen_shapes.emplace_back(e.name, torch_size(e.shape));
    } else {
      buffer_names.push_back(py_str(e.name));
    }
  }
  // DeepSpeed counts its schedule's last_batch_iteration from -1.
  std::vector<std::pair<std::string, PyRef>> states = {
      {"module", parts.module},
      {"buffer_names", py_list(buffer_names)},
      {"optimizer", parts.optimizer ? parts.optimizer : py_none()},
      {"param_shapes", py_list(shape_groups)},
      {"frozen_param_shapes", parts.frozen_fragments ? py_dict(frozen_shapes) : py_none()},
      {"shared_params", py_dict({})},
      {"frozen_param_fragments", parts.frozen_fragments ? parts.frozen_fragments : py_none()},
      {"lr_scheduler", m.scheduler.empty() ? py_none()
                                           : py_dict({{"last_batch_iteration", py_int(m.scheduler_position - 1)}})},
      {"data_sampler", py_none()},
      {"random_ltd", py_none()},
      {"skipped_steps", py_int(m.skipped_steps)},
      {"global_steps", py_int(m.global_steps)},
      {"global_samples", py_int(m.global_samples)},
      {"dp_world_size", py_int(parts.dp_world_size)},
      {"mp_world_size", py_int(1)},
      {"ds_config", json_to_py(m.config)},
      {"ds_version", py_str(kDeepSpeedVersion)},
  };
  if (m.client_state.is_object()) {
    for (const auto& [key, value] : m.client_state.items()) states.emplace_back(key, json_to_py(value));
  }
  return py_dict(states);
}

}  // namespace deepspeed_export

DeepSpeedExport write_deepspeed_checkpoint(const std::string& checkpoint_dir, const std::string& tag_arg,
                                           const std::string& out_dir, DeepSpeedLayout layout) {
  using namespace deepspeed_export;  // here, not at namespace scope: a unity batch would carry it into later files
  if (!layout.is_universal && (layout.zero_stage < 0 || layout.zero_stage > 3)) {
    throw std::invalid_argument("DeepSpeed's ZeRO stage " + std::to_string(layout.zero_stage) +
                                ": the stages are 0, 1, 2 and 3");
  }
  if (!layout.is_universal && layout.world_size < 0) {
    throw std::invalid_argument("DeepSpeed's data-parallel world size " + std::to_string(layout.world_size) +
                                ": must be at least 1 (0: the saving run's)");
  }
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
  const bool zero0 = !layout.is_universal && layout.zero_stage == 0;
  if (zero0 && m.compute_dtype != "fp32") {
    throw CheckpointError(source + ": a " + m.compute_dtype + " run; DeepSpeed's ZeRO-0 layout is written for fp32 "
                          "runs (a 16-bit run without ZeRO has DeepSpeed's own optimizer wrapper): write its ZeRO "
                          "1-3 files or the universal checkpoint");
  }
  if (m.pipeline_parallel * m.tensor_parallel != 1) {
    throw CheckpointError(source + ": written by a pipeline- or tensor-parallel run; DeepSpeed's layout for those is "
                          "not written yet");
  }
  // DeepSpeed's universal load restores trainable parameters only (engine.py skips the module state under
  // load_universal): buffers and frozen parameters would silently keep the loading script's initial values.
  if (layout.is_universal && !m.module_state.empty()) {
    const auto& e = m.module_state.front();
    throw CheckpointError(source + ": the model has " + std::to_string(m.module_state.size()) +
                          " buffers or frozen parameters (" + (e.frozen ? "frozen parameter '" : "buffer '") +
                          e.name + "'), which DeepSpeed's universal load does not restore; write DeepSpeed's files "
                          "for the stage and world size it continues at (--zero_stage, --world_size), which carry "
                          "them");
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

  WholeRun run;
  run.manifest = &m;
  run.compute_dtype = m.compute_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  run.clip_grad = config.gradient_clipping;
  run.sub_group_size = config.zero.sub_group_size;
  // Every key DeepSpeed's FusedAdam keeps (torch's load_state_dict restores each from the file); torch's Adam(W)
  // fills in its own defaults for the rest.
  run.adam_group = py_dict({{"lr", py_float(lr)},
                            {"bias_correction", py_bool(adam.bias_correction)},
                            {"betas", betas},
                            {"eps", py_float(adam.eps)},
                            {"weight_decay", py_float(adam.weight_decay)},
                            {"step", py_int(0)}});
  for (const auto& p : m.params) {
    auto read = [&](const std::string& kind) {
      auto out = torch::empty({p.numel()}, torch::kFloat32);
      checkpoint.read_range(kind, p.name, 0, out);
      return out.reshape(p.shape);
    };
    run.master.push_back(read(kMasterKind));
    for (const auto& kind : m.optimizer_state) run.state[kind].push_back(read(kind));
  }
  for (const auto& e : m.module_state) {
    run.module_state.push_back(checkpoint.read(e.rank, shard_tensor_name(kModuleKind, e.name)));
  }

  prepare_staging(out_dir, tag);
  const fs::path staging = staging_dir(out_dir, tag);
  DeepSpeedExport result;
  result.tag = tag;
  for (const auto& p : m.params) {
    ++result.parameters;
    result.elements += p.numel();
  }
  if (layout.is_universal) {
    std::vector<std::pair<std::string, PyRef>> scheduled;
    if (schedule) scheduled.emplace_back("lr", py_float(lr));
    if (scheduled_betas) scheduled.emplace_back("betas", betas);
    result.files = write_universal(run, py_dict(scheduled), staging);
  } else if (zero0) {
    result.files = write_zero0(run, layout.world_size > 0 ? layout.world_size : m.world_size, staging);
  } else {
    result.world_size = layout.world_size > 0 ? layout.world_size : m.world_size;
    result.files = write_zero_partitions(run, layout.zero_stage, result.world_size, staging);
  }
  publish_staging(out_dir, tag);
  if (layout.is_universal) write_file_durably((fs::path(out_dir) / "latest_universal").string(), tag);
  write_latest(out_dir, tag);
  return result;
}

}  // namespace dscpp
