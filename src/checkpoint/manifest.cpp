// Manifest: JSON in and out, and the checks that make a bad manifest an error naming what is wrong.
#include "dscpp/checkpoint/manifest.h"

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

nlohmann::json Manifest::to_json() const {
  nlohmann::json params_json = nlohmann::json::array();
  for (const auto& p : params) params_json.push_back({{"name", p.name}, {"shape", p.shape}});
  nlohmann::json module_json = nlohmann::json::array();
  for (const auto& e : module_state) {
    module_json.push_back(
        {{"name", e.name}, {"shape", e.shape}, {"dtype", safetensors_dtype(e.dtype)}, {"frozen", e.frozen}});
  }
  nlohmann::json files_json = nlohmann::json::array();
  for (const auto& f : files) {
    nlohmann::json fragments = nlohmann::json::array();
    for (const auto& fr : f.fragments) fragments.push_back({fr.param, fr.begin, fr.numel});
    files_json.push_back({{"rank", f.rank}, {"file", f.file}, {"bytes", f.bytes}, {"crc32", f.crc32},
                          {"fragments", fragments}, {"tensor_crc32", f.tensor_crc32}});
  }
  return {{"format", "deepspeed.cpp checkpoint"},
          {"version", version},
          {"tag", tag},
          {"world_size", world_size},
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
    const auto dtype = get<std::string>(e, "dtype", source, "module_state[]");
    torch::ScalarType type;
    try {
      type = safetensors_scalar_type(dtype);
    } catch (const std::invalid_argument& error) {
      throw CheckpointError(source + ": module_state[]: " + error.what());
    }
    m.module_state.push_back({get<std::string>(e, "name", source, "module_state[]"),
                              get<std::vector<int64_t>>(e, "shape", source, "module_state[]"), type,
                              get<bool>(e, "frozen", source, "module_state[]")});
  }
  m.config = json.value("config", nlohmann::json());
  m.client_state = json.value("client_state", nlohmann::json());
  if (m.world_size < 1 || m.zero_stage < 0 || m.zero_stage > 3) {
    throw CheckpointError(source + ": world_size " + std::to_string(m.world_size) + " / zero_stage " +
                          std::to_string(m.zero_stage) + " out of range");
  }

  std::map<std::string, size_t> param_index;
  for (const auto& p : get<nlohmann::json>(json, "params", source)) {
    ParamEntry entry{get<std::string>(p, "name", source, "params[]"),
                     get<std::vector<int64_t>>(p, "shape", source, "params[]")};
    int64_t numel = 1;
    for (int64_t d : entry.shape) {
      if (d < 0 || (d > 0 && numel > (int64_t{1} << 62) / d)) {
        throw CheckpointError(source + ": parameter '" + entry.name + "' has an impossible shape");
      }
      numel *= d;
    }
    if (!param_index.emplace(entry.name, m.params.size()).second) {
      throw CheckpointError(source + ": parameter '" + entry.name + "' listed twice");
    }
    m.params.push_back(std::move(entry));
  }

  // Every parameter must be tiled exactly by the fragments of all files, or some values would be missing.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cover(m.params.size());
  for (const auto& f : get<nlohmann::json>(json, "files", source)) {
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
      if (!fr.is_array() || fr.size() != 3 || !fr[0].is_string() || !fr[1].is_number_integer() ||
          !fr[2].is_number_integer()) {
        throw CheckpointError(source + ": " + file.file + ": a fragment is not [param, begin, numel]: " + fr.dump());
      }
      Fragment fragment{fr[0].get<std::string>(), fr[1].get<int64_t>(), fr[2].get<int64_t>()};
      auto it = param_index.find(fragment.param);
      if (it == param_index.end()) {
        throw CheckpointError(source + ": " + file.file + " holds a fragment of '" + fragment.param +
                              "', which is not in \"params\"");
      }
      const int64_t param_numel = m.params[it->second].numel();
      if (fragment.begin < 0 || fragment.numel <= 0 || fragment.begin > param_numel ||
          fragment.numel > param_numel - fragment.begin) {
        throw CheckpointError(source + ": " + file.file + ": fragment of '" + fragment.param + "' [" +
                              std::to_string(fragment.begin) + ", +" + std::to_string(fragment.numel) +
                              ") is outside the parameter");
      }
      cover[it->second].emplace_back(fragment.begin, fragment.numel);
      file.fragments.push_back(std::move(fragment));
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
  for (size_t i = 0; i < m.params.size(); ++i) {
    auto& ranges = cover[i];
    std::sort(ranges.begin(), ranges.end());
    int64_t next = 0;  // sorted by start, each range must begin where the previous ended: no gap, no overlap
    bool tiled = true;
    for (const auto& [begin, numel] : ranges) {
      tiled = tiled && begin == next;
      next = begin + numel;
    }
    if (!tiled || next != m.params[i].numel()) {
      throw CheckpointError(source + ": the shard files do not hold parameter '" + m.params[i].name +
                            "' exactly once (covered up to element " + std::to_string(next) + " of " +
                            std::to_string(m.params[i].numel()) + ")");
    }
  }
  return m;
}

}  // namespace

Manifest Manifest::read(const std::string& tag_dir) {
  const std::string path = tag_dir + "/" + kManifestFile;
  std::ifstream in(path);
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
