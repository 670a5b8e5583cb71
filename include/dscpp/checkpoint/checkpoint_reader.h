// CheckpointReader: one checkpoint tag as its manifest describes it. Shard files are opened once, on first use, and
// checked against the manifest's size; every tensor read is checked against the manifest's CRC-32. Parameters are
// read by element range, from whichever ranks' fragments hold the range, so the engine's resharding load and
// `dscpp consolidate` both read through it without knowing the writer's layout. A parameter that tensor-parallel
// ranks wrote as slices (or that the reader wants a slice of) is assembled whole from every writer's slice and the
// reader's slice taken from it; the last parameter assembled is kept while it is read again (its other kinds, other
// ranges), so a load assembles each parameter once.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/checkpoint/manifest.h"
#include "dscpp/checkpoint/safetensors.h"

namespace dscpp {

class CheckpointReader {
 public:
  // Reads and validates `tag_dir`/manifest.json. Throws CheckpointError naming the file.
  explicit CheckpointReader(std::string tag_dir);

  const Manifest& manifest() const { return manifest_; }
  const std::string& tag_dir() const { return tag_dir_; }

  // Elements [begin, begin + out.numel()) of parameter `param`'s `kind` tensor (kMasterKind, an optimizer state,
  // kParam16Kind) into `out` (1-D, contiguous, CPU, the stored dtype). Fragments that lie wholly inside the range
  // are read straight into place. Throws CheckpointError naming the file: missing, truncated, a CRC mismatch, a
  // tensor the manifest promises but the file lacks.
  // `slice`: the elements are of that slice of the parameter, flattened (a tensor-parallel reader's; null: the whole).
  void read_range(const std::string& kind, const std::string& param, int64_t begin, torch::Tensor out,
                  const TensorSlice* slice = nullptr);

  // A whole tensor of rank `rank`'s file (e.g. kRngTensor), checked.
  torch::Tensor read(int rank, const std::string& name);

 private:
  SafetensorsReader& file(int rank);
  void read_into(int rank, const std::string& name, torch::Tensor out);
  // Reads [begin, begin + out.numel()) from `fragments`, whose ranges are of one flattening (the whole's or a slice's).
  void read_fragments(const std::string& name, const std::vector<std::pair<int, const Fragment*>>& fragments,
                      int64_t begin, torch::Tensor out);
  // The whole parameter's `kind` tensor (flat, `options`' dtype), from every writer's fragments and slices.
  const torch::Tensor& assemble(const std::string& kind, const std::string& param, const torch::TensorOptions& options);

  std::string tag_dir_;
  Manifest manifest_;
  std::map<std::string, std::vector<std::pair<int, const Fragment*>>> fragments_;  // param → (rank, fragment)
  std::vector<std::unique_ptr<SafetensorsReader>> files_;                          // by rank, opened on first use
  std::map<std::string, const ParamEntry*> params_;
  std::string assembled_param_;                        // the parameter whose whole tensors assembled_ holds
  std::map<std::string, torch::Tensor> assembled_;     // by kind
};

}  // namespace dscpp
