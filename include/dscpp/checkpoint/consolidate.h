// consolidate: a checkpoint's whole weights as safetensors (DeepSpeed's zero_to_fp32.py), for any world size and
// stage that wrote it. Streaming: one parameter is assembled from its fragments, written and dropped before the
// next, so peak memory is about the largest parameter, never the model.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dscpp {

enum class WeightsFormat {
  kNative,  // the model's own names and layouts
  kHfGpt2,  // HF GPT-2 (Conv1D weights transposed) plus config.json when the checkpoint says the model's shape
};

struct ConsolidateOptions {
  std::string tag;                         // "" = the tag `latest` names
  torch::ScalarType dtype = torch::kFloat32;  // fp32 comes from the master copy; bf16/fp16 from the 16-bit weights
                                              // when the run trained in that dtype, else rounded from the master
  int64_t max_shard_bytes = 5'000'000'000;  // HF's max_shard_size: more than this per file starts a new one
  WeightsFormat format = WeightsFormat::kNative;
};

struct ConsolidateResult {
  std::string tag;
  std::vector<std::string> files;   // written, in order (and model.safetensors.index.json when sharded)
  int64_t total_bytes = 0;          // tensor bytes over all files
  int64_t largest_tensor_bytes = 0;
};

// Writes `out_dir`/model.safetensors, or model-0000i-of-0000n.safetensors and model.safetensors.index.json when
// the weights exceed max_shard_bytes: the trained parameters and (native format) the module's buffers and frozen
// parameters, so the result loads into the model with load_state_dict(strict=True). Every fragment is checked against its CRC. Throws CheckpointError naming the
// file and the problem; files are only moved into place once complete.
ConsolidateResult consolidate(const std::string& checkpoint_dir, const std::string& out_dir,
                              const ConsolidateOptions& options);

// "5GB", "500MB", "10GiB", "123" (bytes) → bytes. Throws std::invalid_argument naming the text.
int64_t parse_byte_size(const std::string& text);

}  // namespace dscpp
