// CheckpointReader: ranges of parameters from the fragments that hold them, every byte checked.
#include "dscpp/checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <filesystem>

namespace fs = std::filesystem;

namespace dscpp {

CheckpointReader::CheckpointReader(std::string tag_dir)
    : tag_dir_(std::move(tag_dir)), manifest_(Manifest::read(tag_dir_)), files_(manifest_.world_size) {
  for (int r = 0; r < manifest_.world_size; ++r) {
    for (const auto& f : manifest_.files[r].fragments) fragments_[f.param].emplace_back(r, &f);
  }
  for (const auto& p : manifest_.params) params_.emplace(p.name, &p);
}

SafetensorsReader& CheckpointReader::file(int rank) {
  if (!files_[rank]) {
    const auto& entry = manifest_.files[rank];
    const auto path = (fs::path(tag_dir_) / entry.file).string();
    if (!fs::exists(path)) throw CheckpointError(path + ": shard file of rank " + std::to_string(rank) + " is missing");
    // The manifest names plain files of the tag's own directory (Manifest checks the names); a link there would
    // read a file from elsewhere.
    if (fs::is_symlink(path)) {
      throw CheckpointError(path + ": shard file of rank " + std::to_string(rank) + " is a symbolic link; shard files "
                            "must be regular files inside the tag's directory");
    }
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
                                  torch::Tensor out, const TensorSlice* slice) {
  if (out.numel() == 0) return;  // an empty parameter has no fragments
  auto it = fragments_.find(param);
  if (it == fragments_.end()) throw CheckpointError(tag_dir_ + ": the checkpoint has no parameter '" + param + "'");
  // The fragments of the reader's own flattening (the whole's, or the same slice: the manifest checked that each
  // slice's fragments tile it), when the writer had one: read straight from them.
  std::vector<std::pair<int, const Fragment*>> mine;
  for (const auto& f : it->second) {
    if (slice ? (f.second->slice && *f.second->slice == *slice) : !f.second->slice) mine.push_back(f);
  }
  if (!mine.empty()) {
    read_fragments(shard_tensor_name(kind, param), mine, begin, out);
    return;
  }
  const auto& whole = assemble(kind, param, out.options());
  const auto part = slice ? slice->take(whole).view({-1}) : whole;
  out.copy_(part.narrow(0, begin, out.numel()));
}

void CheckpointReader::read_fragments(const std::string& name,
                                      const std::vector<std::pair<int, const Fragment*>>& fragments, int64_t begin,
                                      torch::Tensor out) {
  const int64_t end = begin + out.numel();
  for (const auto& [rank, have] : fragments) {
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

const torch::Tensor& CheckpointReader::assemble(const std::string& kind, const std::string& param,
                                                const torch::TensorOptions& options) {
  if (assembled_param_ != param) {
    assembled_.clear();
    assembled_param_ = param;
  }
  auto& whole = assembled_[kind];
  if (whole.defined() && whole.scalar_type() == options.dtype()) return whole;
  const auto& entry = *params_.at(param);
  whole = torch::empty({entry.numel()}, options);
  // Group the fragments by the writer's flattening: the whole's, or each slice's.
  std::map<std::string, std::vector<std::pair<int, const Fragment*>>> by_slice;
  for (const auto& f : fragments_.at(param)) {
    by_slice[f.second->slice ? f.second->slice->to_json().dump() : ""].push_back(f);
  }
  const auto name = shard_tensor_name(kind, param);
  for (const auto& [key, fragments] : by_slice) {
    const auto* slice = fragments.front().second->slice ? &*fragments.front().second->slice : nullptr;
    if (!slice) {
      read_fragments(name, fragments, 0, whole);
      continue;
    }
    auto local = torch::empty({slice->numel()}, options);
    read_fragments(name, fragments, 0, local);
    slice->put(local, whole);
  }
  return whole;
}

}  // namespace dscpp
