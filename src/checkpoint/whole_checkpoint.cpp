#include "dscpp/checkpoint/whole_checkpoint.h"

#include <filesystem>
#include <vector>

#include "dscpp/checkpoint/checkpoint_dir.h"
#include "dscpp/checkpoint/safetensors.h"

namespace fs = std::filesystem;

namespace dscpp {

namespace {

// The tensor under `name`, checked against the element count and (module tensors) dtype its entry declares.
const torch::Tensor& entry_tensor(const WholeCheckpoint& c, const std::string& name, int64_t numel) {
  const auto it = c.tensors.find(name);
  if (it == c.tensors.end()) throw CheckpointError("write checkpoint " + c.manifest.tag + ": no tensor " + name);
  if (it->second.numel() != numel) {
    throw CheckpointError("write checkpoint " + c.manifest.tag + ": " + name + " has " +
                          std::to_string(it->second.numel()) + " elements, its entry " + std::to_string(numel));
  }
  return it->second;
}

}  // namespace

void write_whole_checkpoint(WholeCheckpoint checkpoint, const std::string& out_dir) {
  Manifest& m = checkpoint.manifest;
  check_tag(m.tag);
  m.world_size = 1;
  m.pipeline_parallel = 1;
  m.tensor_parallel = 1;

  // One file: every parameter as one fragment of each kind, then the module tensors.
  ShardFile file;
  file.rank = 0;
  file.file = shard_file_name(0);
  std::vector<TensorInfo> infos;
  std::vector<std::pair<std::string, torch::Tensor>> values;
  std::vector<std::string> kinds{kMasterKind};
  kinds.insert(kinds.end(), m.optimizer_state.begin(), m.optimizer_state.end());
  for (const auto& p : m.params) {
    for (const auto& kind : kinds) {
      const auto name = shard_tensor_name(kind, p.name);
      const auto& t = entry_tensor(checkpoint, name, p.numel());
      infos.push_back({name, torch::kFloat32, {p.numel()}});
      values.emplace_back(name, t.reshape({-1}));
    }
    file.fragments.push_back({p.name, 0, p.numel(), std::nullopt});
  }
  for (auto& e : m.module_state) {
    e.rank = 0;
    const auto name = shard_tensor_name(kModuleKind, e.name);
    int64_t numel = 1;
    for (auto d : e.shape) numel *= d;
    const auto& t = entry_tensor(checkpoint, name, numel);
    if (t.scalar_type() != e.dtype) throw CheckpointError("write checkpoint " + m.tag + ": " + name + " is not " +
                                                          std::string(c10::toString(e.dtype)));
    infos.push_back({name, e.dtype, e.shape});
    values.emplace_back(name, t.reshape(e.shape));
  }

  prepare_staging(out_dir, m.tag);
  mark_first_save(out_dir);
  const auto staging = staging_dir(out_dir, m.tag);
  SafetensorsWriter writer((fs::path(staging) / file.file).string(), infos);
  for (const auto& [name, t] : values) writer.write(name, t);
  writer.close();
  file.bytes = writer.file_bytes();
  file.crc32 = writer.file_crc32();
  for (const auto& info : infos) file.tensor_crc32[info.name] = writer.tensor_crc32(info.name);
  m.files = {file};
  // The manifest must read back: the same checks a load makes, before the tag is published.
  Manifest::from_json(m.to_json(), m.tag + "/" + kManifestFile);
  write_file_durably((fs::path(staging) / kManifestFile).string(), m.to_json().dump(1));
  publish_staging(out_dir, m.tag);
  write_latest(out_dir, m.tag);
}

}  // namespace dscpp
