// CheckpointReader: ranges of parameters from the fragments that hold them, every byte checked.
#include "dscpp/checkpoint/checkpoint_reader.h"

#include <filesystem>

namespace fs = std::filesystem;

namespace dscpp {

CheckpointReader::CheckpointReader(std::string tag_dir)
    : tag_dir_(std::move(tag_dir)), manifest_(Manifest::read(tag_dir_)), files_(manifest_.world_size) {
  for (int r = 0; r < manifest_.world_size; ++r) {
    for (const auto& f : manifest_.files[r].fragments) fragments_[f.param].emplace_back(r, &f);
  }
}

SafetensorsReader& CheckpointReader::file(int rank) {
  if (!files_[rank]) {
    const auto& entry = manifest_.files[rank];
    const auto path = (fs::path(tag_dir_) / entry.file).string();
    if (!fs::exists(path)) throw CheckpointError(path + ": shard file of rank " + std::to_string(rank) + " is missing");
    try {
      files_[rank] = std::make_unique<SafetensorsReader>(path);
    } catch (const CheckpointError&) {
      throw;
    } catch (const std::runtime_error& e) {
      throw CheckpointError(e.what());
    }
    if (files_[rank]->file_bytes() != entry.bytes) {
      const auto bytes = files_[rank]->file_bytes();
      files_[rank].reset();
      throw CheckpointError(path + ": " + std::to_string(bytes) + " bytes, the manifest says " +
                            std::to_string(entry.bytes) + " (truncated or replaced)");
    }
  }
  return *files_[rank];
}

void CheckpointReader::read_into(int rank, const std::string& name, torch::Tensor out) {
  auto& in = file(rank);
  const auto& sums = manifest_.files[rank].tensor_crc32;
  auto crc = sums.find(name);
  if (crc == sums.end()) throw CheckpointError(in.path() + ": the manifest has no checksum for tensor '" + name + "'");
  if (!in.contains(name)) throw CheckpointError(in.path() + ": has no tensor '" + name + "' (the manifest lists it)");
  try {
    in.read_into(name, out, crc->second);
  } catch (const std::exception& e) {
    throw CheckpointError(e.what());
  }
}

torch::Tensor CheckpointReader::read(int rank, const std::string& name) {
  auto& in = file(rank);
  if (!in.contains(name)) throw CheckpointError(in.path() + ": has no tensor '" + name + "'");
  const auto& stored = in.tensor(name);
  auto out = torch::empty(stored.info.shape, torch::TensorOptions().dtype(stored.info.dtype));
  read_into(rank, name, out);
  return out;
}

void CheckpointReader::read_range(const std::string& kind, const std::string& param, int64_t begin,
                                  torch::Tensor out) {
  if (out.numel() == 0) return;  // an empty parameter has no fragments
  auto it = fragments_.find(param);
  if (it == fragments_.end()) throw CheckpointError(tag_dir_ + ": the checkpoint has no parameter '" + param + "'");
  const int64_t end = begin + out.numel();
  const auto name = shard_tensor_name(kind, param);
  for (const auto& [rank, have] : it->second) {
    const int64_t from = std::max(begin, have->begin), to = std::min(end, have->begin + have->numel);
    if (from >= to) continue;
    auto place = out.narrow(0, from - begin, to - from);
    if (from == have->begin && to == have->begin + have->numel) {
      read_into(rank, name, place);
    } else {
      auto whole = torch::empty({have->numel}, out.options());
      read_into(rank, name, whole);
      place.copy_(whole.narrow(0, from - have->begin, to - from));
    }
  }
}

}  // namespace dscpp
