// Manifest: JSON in and out, and the checks that make a bad manifest an error naming what is wrong.
#include "dscpp/checkpoint/manifest.h"

#include "dscpp/checkpoint/deepspeed_checkpoint.h"

#include "dscpp/checkpoint/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace dscpp {
namespace {

// Reads json[key] as T, or throws naming the manifest and the key.
template <typename T>
T get(const nlohmann::json& json, const std::string& key, const std::string& source, const std::string& where = "") {
  const std::string path = where.empty() ? key : where + "." + key;
  if (!json.is_object() || !json.contains(key)) throw CheckpointError(source + ": missing key '" + path + "'");
  try {
    return json.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw CheckpointError(source + ": key '" + path + "' has the wrong type (" + json.at(key).dump() + ")");
  }
}

// Manifest::from_json without the translation of JSON type errors.
Manifest parse_manifest(const nlohmann::json& json, const std::string& source);

}  // namespace

int64_t ParamEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shard_tensor_name(const std::string& kind, const std::string& param) { return kind + "/" + param; }

std::string shard_file_name(int rank) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank_%05d.safetensors", rank);
  return name;
}

nlohmann::json to_json(const ParamEntry& p) { return {{"name", p.name}, {"shape", p.shape}}; }

nlohmann::json to_json(const ModuleStateEntry& e) {
  nlohmann::json out = {{"name", e.name}, {"shape", e.shape}, {"dtype", safetensors_dtype(e.dtype)},
                        {"frozen", e.frozen}};
  if (e.rank != 0) out["rank"] = e.rank;
  return out;
}

nlohmann::json ShardFile::to_json() const {
  nlohmann::json fragments_json = nlohmann::json::array();
  for (const auto& fr : fragments) {
    nlohmann::json entry = {fr.param, fr.begin, fr.numel};
    if (fr.slice) entry.push_back(fr.slice->to_json());
    fragments_json.push_back(entry);
  }
  return {{"rank", rank}, {"file", file}, {"bytes", bytes}, {"crc32", crc32}, {"fragments", fragments_json},
          {"tensor_crc32", tensor_crc32}};
}

ParamEntry param_entry_from_json(const nlohmann::json& p, const std::string& source) {
  ParamEntry entry{get<std::string>(p, "name", source, "params[]"),
                   get<std::vector<int64_t>>(p, "shape", source, "params[]")};
  int64_t numel = 1;
  for (int64_t d : entry.shape) {
    if (d < 0 || (d > 0 && numel > (int64_t{1} << 62) / d)) {
      throw CheckpointError(source + ": parameter '" + entry.name + "' has an impossible shape");
    }
    numel *= d;
  }
  return entry;
}

ModuleStateEntry module_state_entry_from_json(const nlohmann::json& e, const std::string& source) {
  const auto dtype = get<std::string>(e, "dtype", source, "module_state[]");
  torch::ScalarType type;
  try {
    type = safetensors_scalar_type(dtype);
  } catch (const std::invalid_argument& error) {
    throw CheckpointError(source + ": module_state[]: " + error.what());
  }
  return {get<std::string>(e, "name", source, "module_state[]"),
          get<std::vector<int64_t>>(e, "shape", source, "module_state[]"), type,
          get<bool>(e, "frozen", source, "module_state[]"), e.is_object() ? e.value("rank", 0) : 0};
}

ShardFile ShardFile::from_json(const nlohmann::json& f, const std::string& source) {
  ShardFile file;
  file.rank = get<int>(f, "rank", source, "files[]");
  file.file = get<std::string>(f, "file", source, "files[]");
  file.bytes = get<int64_t>(f, "bytes", source, "files[]");
  file.crc32 = get<uint32_t>(f, "crc32", source, "files[]");
  file.tensor_crc32 = get<std::map<std::string, uint32_t>>(f, "tensor_crc32", source, "files[]");
  if (file.file.empty() || file.file.find('/') != std::string::npos || file.file[0] == '.') {
    throw CheckpointError(source + ": shard file name '" + file.file + "' is not a plain file name");
  }
  for (const auto& fr : get<nlohmann::json>(f, "fragments", source, "files[]")) {
    if (!fr.is_array() || fr.size() < 3 || fr.size() > 4 || !fr[0].is_string() || !fr[1].is_number_integer() ||
        !fr[2].is_number_integer()) {
      throw CheckpointError(source + ": " + file.file + ": a fragment is not [param, begin, numel] or [param, begin, "
                            "numel, slice]: " + fr.dump());
    }
    Fragment fragment{fr[0].get<std::string>(), fr[1].get<int64_t>(), fr[2].get<int64_t>(), std::nullopt};
    if (fr.size() == 4) {
      try {
        fragment.slice = TensorSlice::from_json(fr[3]);
      } catch (const std::invalid_argument& e) {
        throw CheckpointError(source + ": " + file.file + ": fragment of '" + fragment.param + "': " + e.what());
      }
    }
    file.fragments.push_back(std::move(fragment));
  }
  return file;
}

nlohmann::json Manifest::to_json() const {
  nlohmann::json params_json = nlohmann::json::array();
  for (const auto& p : params) params_json.push_back(dscpp::to_json(p));
  nlohmann::json module_json = nlohmann::json::array();
  for (const auto& e : module_state) module_json.push_back(dscpp::to_json(e));
  nlohmann::json files_json = nlohmann::json::array();
  for (const auto& f : files) files_json.push_back(f.to_json());
  return {{"format", "deepspeed.cpp checkpoint"},
          {"version", version},
          {"tag", tag},
          {"world_size", world_size},
          {"layout", {{"pipeline_parallel", pipeline_parallel}, {"tensor_parallel", tensor_parallel}}},
          {"zero_stage", zero_stage},
          {"compute_dtype", compute_dtype},
          {"global_steps", global_steps},
          {"micro_steps", micro_steps},
          {"skipped_steps", skipped_steps},
          {"global_samples", global_samples},
          {"optimizer", {{"type", optimizer}, {"step_count", optimizer_step_count}, {"state", optimizer_state}}},
          {"scheduler", {{"type", scheduler}, {"position", scheduler_position}}},
          {"loss_scaler",
           {{"type", loss_scaler.type},
            {"scale", loss_scaler.scale},
            {"iteration", loss_scaler.iteration},
            {"last_overflow_iteration", loss_scaler.last_overflow_iteration},
            {"hysteresis", loss_scaler.hysteresis}}},
          {"params", params_json},
          {"module_state", module_json},
          {"files", files_json},
          {"config", config},
          {"client_state", client_state}};
}

Manifest Manifest::from_json(const nlohmann::json& json, const std::string& source) {
  try {
    return parse_manifest(json, source);
  } catch (const nlohmann::json::exception& e) {
    // A value of an unexpected JSON type somewhere the checks above did not look.
    throw CheckpointError(source + ": malformed manifest: " + e.what());
  }
}

namespace {

Manifest parse_manifest(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object() || json.value("format", "") != "deepspeed.cpp checkpoint") {
    throw CheckpointError(source + ": not a deepspeed.cpp checkpoint manifest (no \"format\": \"deepspeed.cpp "
                          "checkpoint\")");
  }
  Manifest m;
  m.version = get<int>(json, "version", source);
  if (m.version != kCheckpointFormatVersion) {
    throw CheckpointError(source + ": format version " + std::to_string(m.version) + ", this build reads version " +
                          std::to_string(kCheckpointFormatVersion));
  }
  m.tag = get<std::string>(json, "tag", source);
  m.world_size = get<int>(json, "world_size", source);
  m.zero_stage = get<int>(json, "zero_stage", source);
  m.compute_dtype = get<std::string>(json, "compute_dtype", source);
  m.global_steps = get<int64_t>(json, "global_steps", source);
  m.micro_steps = get<int64_t>(json, "micro_steps", source);
  m.skipped_steps = get<int64_t>(json, "skipped_steps", source);
  m.global_samples = get<int64_t>(json, "global_samples", source);
  const auto optimizer = get<nlohmann::json>(json, "optimizer", source);
  m.optimizer = get<std::string>(optimizer, "type", source, "optimizer");
  m.optimizer_step_count = get<int64_t>(optimizer, "step_count", source, "optimizer");
  m.optimizer_state = get<std::vector<std::string>>(optimizer, "state", source, "optimizer");
  const auto scheduler = get<nlohmann::json>(json, "scheduler", source);
  m.scheduler = get<std::string>(scheduler, "type", source, "scheduler");
  m.scheduler_position = get<int64_t>(scheduler, "position", source, "scheduler");
  const auto scaler = get<nlohmann::json>(json, "loss_scaler", source);
  m.loss_scaler.type = get<std::string>(scaler, "type", source, "loss_scaler");
  m.loss_scaler.scale = get<double>(scaler, "scale", source, "loss_scaler");
  m.loss_scaler.iteration = get<int64_t>(scaler, "iteration", source, "loss_scaler");
  m.loss_scaler.last_overflow_iteration = get<int64_t>(scaler, "last_overflow_iteration", source, "loss_scaler");
  m.loss_scaler.hysteresis = get<int>(scaler, "hysteresis", source, "loss_scaler");
  // Written since module state was saved; a manifest without it has none (the load keeps the model's own).
  for (const auto& e : json.value("module_state", nlohmann::json::array())) {
    m.module_state.push_back(module_state_entry_from_json(e, source));
  }
  // Written since 3D parallelism; a manifest without it was written by data parallelism alone.
  const auto layout = json.value("layout", nlohmann::json::object());
  m.pipeline_parallel = layout.value("pipeline_parallel", 1);
  m.tensor_parallel = layout.value("tensor_parallel", 1);
  m.config = json.value("config", nlohmann::json());
  m.client_state = json.value("client_state", nlohmann::json());
  if (m.world_size < 1 || m.zero_stage < 0 || m.zero_stage > 3) {
    throw CheckpointError(source + ": world_size " + std::to_string(m.world_size) + " / zero_stage " +
                          std::to_string(m.zero_stage) + " out of range");
  }

  std::map<std::string, size_t> param_index;
  for (const auto& p : get<nlohmann::json>(json, "params", source)) {
    auto entry = param_entry_from_json(p, source);
    if (!param_index.emplace(entry.name, m.params.size()).second) {
      throw CheckpointError(source + ": parameter '" + entry.name + "' listed twice");
    }
    m.params.push_back(std::move(entry));
  }

  // Every parameter must be tiled exactly by the fragments of all files, or some values would be missing: the whole
  // parameter's elements by its unsliced fragments, or each slice's elements by its fragments and the parameter's
  // dimension by the slices' pieces.
  struct Cover {
    std::vector<std::pair<int64_t, int64_t>> ranges;  // of the flattened parameter or slice
    std::optional<TensorSlice> slice;
  };
  std::vector<std::map<std::string, Cover>> cover(m.params.size());  // per parameter, by slice ("" = unsliced)
  for (const auto& f : get<nlohmann::json>(json, "files", source)) {
    ShardFile file = ShardFile::from_json(f, source);
    for (const auto& fragment : file.fragments) {
      auto it = param_index.find(fragment.param);
      if (it == param_index.end()) {
        throw CheckpointError(source + ": " + file.file + " holds a fragment of '" + fragment.param +
                              "', which is not in \"params\"");
      }
      const auto& param = m.params[it->second];
      if (fragment.slice && fragment.slice->whole_shape != param.shape) {
        throw CheckpointError(source + ": " + file.file + ": a slice of '" + fragment.param + "' of a tensor of " +
                              "another shape than the parameter's");
      }
      const int64_t numel = fragment.slice ? fragment.slice->numel() : param.numel();
      if (fragment.begin < 0 || fragment.numel <= 0 || fragment.begin > numel ||
          fragment.numel > numel - fragment.begin) {
        throw CheckpointError(source + ": " + file.file + ": fragment of '" + fragment.param + "' [" +
                              std::to_string(fragment.begin) + ", +" + std::to_string(fragment.numel) +
                              ") is outside the " + (fragment.slice ? "slice" : "parameter"));
      }
      auto& c = cover[it->second][fragment.slice ? fragment.slice->to_json().dump() : ""];
      c.slice = fragment.slice;
      c.ranges.emplace_back(fragment.begin, fragment.numel);
    }
    m.files.push_back(std::move(file));
  }
  if (static_cast<int>(m.files.size()) != m.world_size) {
    throw CheckpointError(source + ": lists " + std::to_string(m.files.size()) + " shard files for world_size " +
                          std::to_string(m.world_size));
  }
  for (int r = 0; r < m.world_size; ++r) {
    if (m.files[r].rank != r) throw CheckpointError(source + ": files are not listed by rank (entry " +
                                                    std::to_string(r) + " is rank " + std::to_string(m.files[r].rank) + ")");
  }
  for (const auto& e : m.module_state) {
    if (e.rank < 0 || e.rank >= m.world_size) {
      throw CheckpointError(source + ": module tensor '" + e.name + "' is in the file of rank " +
                            std::to_string(e.rank) + ", of " + std::to_string(m.world_size));
    }
  }
  // Sorted by start, each range must begin where the previous ended: no gap, no overlap; returns where they end.
  const auto tiled_to = [](std::vector<std::pair<int64_t, int64_t>> ranges) -> int64_t {
    std::sort(ranges.begin(), ranges.end());
    int64_t next = 0;
    for (const auto& [begin, numel] : ranges) {
      if (begin != next) return -1;
      next = begin + numel;
    }
    return next;
  };
  for (size_t i = 0; i < m.params.size(); ++i) {
    const auto& param = m.params[i];
    const auto not_once = [&](const std::string& what) {
      return CheckpointError(source + ": the shard files do not hold parameter '" + param.name + "' exactly once (" +
                             what + ")");
    };
    const auto& slices = cover[i];
    if (slices.count("")) {
      if (slices.size() > 1) throw not_once("both whole fragments and slices");
      const int64_t end = tiled_to(slices.at("").ranges);
      if (end != param.numel()) {
        throw not_once("covered up to element " + std::to_string(std::max<int64_t>(end, 0)) + " of " +
                       std::to_string(param.numel()));
      }
      continue;
    }
    if (slices.empty()) {
      if (param.numel() == 0) continue;
      throw not_once("covered up to element 0 of " + std::to_string(param.numel()));
    }
    std::vector<std::pair<int64_t, int64_t>> pieces;
    const int64_t dim = slices.begin()->second.slice->dim;
    for (const auto& [key, c] : slices) {
      if (c.slice->dim != dim) throw not_once("slices along different dimensions");
      if (tiled_to(c.ranges) != c.slice->numel()) throw not_once("a slice's fragments do not tile it");
      pieces.insert(pieces.end(), c.slice->pieces.begin(), c.slice->pieces.end());
    }
    if (tiled_to(pieces) != param.shape[dim]) throw not_once("the slices do not tile dimension " + std::to_string(dim));
  }
  return m;
}

}  // namespace

Manifest Manifest::read(const std::string& tag_dir) {
  const std::string path = tag_dir + "/" + kManifestFile;
  std::ifstream in(path);
  if (!in && is_deepspeed_tag_dir(tag_dir)) {
    throw CheckpointError(tag_dir + ": a checkpoint written by DeepSpeed; convert its save_dir once with `dscpp "
                          "convert --from deepspeed SAVE_DIR OUT_DIR` and load OUT_DIR (docs/checkpoints.md)");
  }
  if (!in) {
    throw CheckpointError(path + ": missing: " + tag_dir + " is not a complete checkpoint (its save did not finish, "
                          "or this is not a checkpoint directory)");
  }
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.str());
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": not valid JSON (" + e.what() + ")");
  }
  return from_json(json, path);
}

}  // namespace dscpp
