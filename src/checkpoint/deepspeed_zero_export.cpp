// DeepSpeed's own ZeRO 1-3 checkpoint files of a run, written for a chosen data-parallel world size (see
// deepspeed_export.h). The partitions follow DeepSpeed 0.19.8's layout, so that its load_checkpoint copies each
// rank's file into that rank's buffers as if it had saved them:
// - ZeRO 1 and 2 (runtime/zero/stage_1_and_2.py): the param group's trainable parameters flattened in order and padded
//   at the end to a multiple of 2 x world (its nccl_start_alignment_factor), then cut into `world` equal partitions;
//   each rank's file holds its partition of the fp32 master (without the padding) and of each Adam moment (with it),
//   and one model-states file holds the whole module in the compute dtype.
// - ZeRO 3 (runtime/zero/stage3.py, partition_parameters.py): every parameter on its own padded to a multiple of
//   `world` and cut into `world` pieces; rank r's fp32 buffer is its pieces of the parameters in order (in sub-groups
//   of zero_optimization.sub_group_size elements), and its model-states file holds the buffers whole, the
//   parameters as empty tensors (DeepSpeed's load checks them against its own released ones) and its pieces of the
//   frozen parameters.
// One param group over the trainable parameters in registration order, as a script passing model.parameters() has;
// a script with several groups gets torch's error naming the count from load_state_dict.
#include <algorithm>
#include <string>

#include "deepspeed_export_internal.h"

namespace fs = std::filesystem;

namespace dscpp::deepspeed_export {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The file names DeepSpeed's engine builds (engine.py's _get_zero_ckpt_name, _get_ckpt_name): a bf16 run's optimizer
// files carry the "bf16_" prefix, which its loader asks for.
std::string optimizer_file(const WholeRun& run, int rank) {
  const std::string prefix = run.compute_dtype == torch::kBFloat16 ? "bf16_" : "";
  return prefix + "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_optim_states.pt";
}

std::string rank_model_file(int rank) { return "zero_pp_rank_" + std::to_string(rank) + "_mp_rank_00_model_states.pt"; }

// {"optimizer_state_dict": ..., "ds_config": ..., "ds_version": ...}: the optimizer file around the state.
void write_optimizer_file(const WholeRun& run, const fs::path& path, PyRef optimizer_state) {
  save_torch_file(path.string(), *py_dict({{"optimizer_state_dict", std::move(optimizer_state)},
                                           {"ds_config", json_to_py(run.manifest->config)},
                                           {"ds_version", py_str(kDeepSpeedVersion)}}));
}

// The trainable parameters' values of one kind (master, a moment), flattened in order, padded with zeros to `total`.
torch::Tensor flat_padded(const std::vector<torch::Tensor>& values, int64_t total) {
  std::vector<torch::Tensor> parts;
  int64_t numel = 0;
  for (const auto& v : values) {
    parts.push_back(v.reshape(-1));
    numel += v.numel();
  }
  parts.push_back(torch::zeros({total - numel}, torch::kFloat32));
  return torch::cat(parts);
}

int64_t write_zero12(const WholeRun& run, int stage, int world, const fs::path& tag_dir) {
  const Manifest& m = *run.manifest;
  int64_t numel = 0;
  for (const auto& p : m.params) numel += p.numel();
  const int64_t alignment = 2 * static_cast<int64_t>(world);
  const int64_t total = ceil_div(numel, alignment) * alignment;
  const int64_t part = total / world;
  const auto master = flat_padded(run.master, total);
  std::vector<torch::Tensor> moments;
  for (const auto& kind : m.optimizer_state) moments.push_back(flat_padded(run.state.at(kind), total));

  // The frozen parameters are in the module whole; from ZeRO 2 on DeepSpeed also lists them as "fragments", whole.
  PyRef frozen = nullptr;
  if (stage == 2) {
    std::vector<std::pair<std::string, PyRef>> fragments;
    for (size_t i = 0; i < m.module_state.size(); ++i) {
      if (m.module_state[i].frozen) fragments.emplace_back(m.module_state[i].name, py_tensor(run.module_state[i]));
    }
    frozen = py_dict(fragments);
  }
  save_torch_file((tag_dir / "mp_rank_00_model_states.pt").string(),
                  *model_states(run, {whole_module(run, run.compute_dtype), nullptr, frozen, {}, world}));
  for (int r = 0; r < world; ++r) {
    const int64_t begin = r * part, end = begin + part;
    const int64_t padding = std::clamp<int64_t>(end - numel, 0, part);
    std::vector<torch::Tensor> rank_moments;
    for (const auto& moment : moments) rank_moments.push_back(moment.slice(0, begin, end).clone());
    // Where each parameter's elements sit in this partition (what ds_to_universal reads).
    std::vector<std::pair<std::string, PyRef>> mappings;
    int64_t offset = 0;
    for (const auto& p : m.params) {
      const int64_t first = std::max(offset, begin), last = std::min(offset + p.numel(), end);
      if (first < last) {
        mappings.emplace_back(p.name, py_object("deepspeed.utils.tensor_fragment.fragment_address", {},
                                                py_dict({{"numel", py_int(last - first)},
                                                         {"start", py_int(first - begin)}})));
      }
      offset += p.numel();
    }
    auto state = py_dict(
        {{"loss_scaler", static_loss_scaler()},
         {"dynamic_loss_scale", py_bool(false)},
         {"overflow", py_bool(false)},
         {"clip_grad", py_float(run.clip_grad)},
         {"base_optimizer_state", adam_state_dict(run, {adam_tensor_state(run, rank_moments)})},
         {"single_partition_of_fp32_groups", py_list({py_tensor(master.slice(0, begin, end - padding).clone())})},
         {"zero_stage", zero_stage_enum(stage)},
         {"group_paddings", py_list({py_int(padding)})},
         {"partition_count", py_list({py_int(world)})},
         {"ds_version", py_str(kDeepSpeedVersion)},
         {"param_slice_mappings", py_list({py_dict(mappings)})}});
    write_optimizer_file(run, tag_dir / optimizer_file(run, r), state);
  }
  return 1 + world;
}

// Rank r's piece of one parameter at ZeRO 3: the flattened values padded with zeros to a multiple of `world`, its
// r-th part (only the trailing ranks' pieces hold padding).
torch::Tensor piece(const torch::Tensor& value, int world, int rank) {
  const int64_t numel = value.numel(), size = ceil_div(numel, world);
  const int64_t begin = std::min(rank * size, numel), end = std::min(begin + size, numel);
  auto out = torch::zeros({size}, value.scalar_type());
  out.slice(0, 0, end - begin).copy_(value.reshape(-1).slice(0, begin, end));
  return out;
}

int64_t write_zero3(const WholeRun& run, int world, const fs::path& tag_dir) {
  const Manifest& m = *run.manifest;
  // DeepSpeed's sub-groups (stage3.py's _create_fp16_sub_groups): parameters in order, a sub-group closed once its
  // pieces reach sub_group_size elements; one group when the whole fits.
  std::vector<size_t> group_end;
  int64_t pieces = 0, whole = 0;
  for (const auto& p : m.params) whole += ceil_div(p.numel(), world);
  for (size_t i = 0; i < m.params.size(); ++i) {
    pieces += ceil_div(m.params[i].numel(), world);
    if (run.sub_group_size < whole && (pieces >= run.sub_group_size || i + 1 == m.params.size())) {
      group_end.push_back(i + 1);
      pieces = 0;
    }
  }
  if (group_end.empty()) group_end.push_back(m.params.size());

  for (int r = 0; r < world; ++r) {
    std::vector<std::pair<std::string, PyRef>> module, frozen;
    for (const auto& p : m.params) module.emplace_back(p.name, py_tensor(torch::empty({0}, run.compute_dtype)));
    for (size_t i = 0; i < m.module_state.size(); ++i) {
      const auto& e = m.module_state[i];
      if (e.frozen) {
        module.emplace_back(e.name, py_tensor(torch::empty({0}, e.dtype)));
        frozen.emplace_back(e.name, py_tensor(piece(run.module_state[i], world, r)));
      } else {
        module.emplace_back(e.name, py_tensor(run.module_state[i]));
      }
    }
    save_torch_file((tag_dir / rank_model_file(r)).string(),
                    *model_states(run, {py_dict(module), nullptr, py_dict(frozen), group_end, world}));

    std::vector<PyRef> flat_groups, states;
    size_t first = 0;
    for (size_t end : group_end) {
      std::vector<torch::Tensor> master;
      std::vector<std::vector<torch::Tensor>> moments(m.optimizer_state.size());
      for (size_t i = first; i < end; ++i) {
        master.push_back(piece(run.master[i], world, r));
        for (size_t k = 0; k < m.optimizer_state.size(); ++k) {
          moments[k].push_back(piece(run.state.at(m.optimizer_state[k])[i], world, r));
        }
      }
      flat_groups.push_back(py_tensor(torch::cat(master)));
      std::vector<torch::Tensor> flat_moments;
      for (const auto& kind : moments) flat_moments.push_back(torch::cat(kind));
      states.push_back(adam_tensor_state(run, flat_moments));
      first = end;
    }
    auto state = py_dict({{"loss_scaler", static_loss_scaler()},
                          {"dynamic_loss_scale", py_bool(false)},
                          {"overflow", py_bool(false)},
                          {"optimizer_state_dict", adam_state_dict(run, states)},
                          {"fp32_flat_groups", py_list(flat_groups)},
                          {"zero_stage", zero_stage_enum(3)},
                          {"partition_count", py_int(world)}});
    write_optimizer_file(run, tag_dir / optimizer_file(run, r), state);
  }
  return 2 * static_cast<int64_t>(world);
}

}  // namespace

int64_t write_zero_partitions(const WholeRun& run, int stage, int world, const fs::path& tag_dir) {
  return stage == 3 ? write_zero3(run, world, tag_dir) : write_zero12(run, stage, world, tag_dir);
}

}  // namespace dscpp::deepspeed_export
