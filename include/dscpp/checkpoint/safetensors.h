// Safetensors files (the Hugging Face format: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw bytes). Nothing in it can execute code on load, which is why
// checkpoints and exported weights use it.
//
// SafetensorsWriter streams: the header is written first from the tensors' descriptions, then each tensor's
// bytes go straight to their place in the file, in any order — so a whole model never has to be in memory at once
// (ZeRO-3 writes one gathered group at a time). The file appears under its final name only after close() has
// written and fsynced everything (temporary name + rename), so a crash leaves no half-written weights behind.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dscpp {

struct TensorInfo {
  std::string name;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
};

class SafetensorsWriter {
 public:
  // Throws std::runtime_error naming `path` when it cannot be created. `metadata` goes in "__metadata__".
  SafetensorsWriter(std::string path, const std::vector<TensorInfo>& tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // an unclosed writer removes its temporary file
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Writes `tensor` (any device; converted to the declared dtype, must have the declared shape) at its place.
  void write(const std::string& name, const torch::Tensor& tensor);

  // Checks every tensor was written, fsyncs and renames the file into place.
  void close();

 private:
  struct Entry {
    TensorInfo info;
    int64_t begin = 0;  // byte offset from the start of the data section
    int64_t bytes = 0;
    bool written = false;
  };
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  int64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
};

// Reads a whole safetensors file: name → tensor (CPU). Throws std::runtime_error naming the file and what is wrong
// (truncated, bad header, unknown dtype).
std::map<std::string, torch::Tensor> read_safetensors(const std::string& path);

// "F32", "BF16", "F16", ... as the format spells them.
std::string safetensors_dtype(torch::ScalarType dtype);

}  // namespace dscpp
