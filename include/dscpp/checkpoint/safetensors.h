// Safetensors files (the Hugging Face format: an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw bytes). Nothing in it can execute code on load, which is why
// checkpoints and exported weights use it.
//
// SafetensorsWriter streams: the header is written first from the tensors' descriptions, then each tensor's
// bytes go straight to their place in the file, in any order — so a whole model never has to be in memory at once
// (ZeRO-3 writes one gathered group at a time). The file appears under its final name only after close() has
// written and fsynced everything (temporary name + rename), so a crash leaves no half-written weights behind.
// It also computes the CRC-32 of every tensor's bytes and of the whole file as it goes, for checkpoint manifests.
//
// SafetensorsReader parses the header and reads one tensor at a time, so a reader never needs the whole file in
// memory either.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
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

  // After close(): the file's size and CRC-32 (zlib's polynomial), and each tensor's bytes' CRC-32.
  int64_t file_bytes() const { return file_bytes_; }
  uint32_t file_crc32() const { return file_crc_; }
  uint32_t tensor_crc32(const std::string& name) const;

 private:
  struct Entry {
    TensorInfo info;
    int64_t begin = 0;  // byte offset from the start of the data section
    int64_t bytes = 0;
    bool written = false;
    uint32_t crc = 0;
  };
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  int64_t data_start_ = 0;
  uint32_t header_crc_ = 0;  // of the length prefix and the JSON header
  std::map<std::string, Entry> entries_;
  int64_t file_bytes_ = 0;
  uint32_t file_crc_ = 0;
};

struct StoredTensor {
  TensorInfo info;
  int64_t offset = 0;  // absolute byte offset in the file
  int64_t bytes = 0;
};

class SafetensorsReader {
 public:
  // Opens and checks `path`: a header that parses, known dtypes, every byte range inside the file. Throws
  // std::runtime_error naming the file and what is wrong (missing, truncated, bad header).
  explicit SafetensorsReader(std::string path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  int64_t file_bytes() const { return file_bytes_; }
  // In file order.
  const std::vector<StoredTensor>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const StoredTensor& tensor(const std::string& name) const;  // throws naming the file and the tensor

  // The tensor's values (CPU, its stored dtype and shape). With `expected_crc32`, the bytes are checked against it
  // and a mismatch throws, naming the file and the tensor.
  torch::Tensor read(const std::string& name, std::optional<uint32_t> expected_crc32 = std::nullopt) const;
  // The same into `out` (contiguous, CPU, the stored dtype and element count; any shape): no temporary copy.
  void read_into(const std::string& name, torch::Tensor& out,
                 std::optional<uint32_t> expected_crc32 = std::nullopt) const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t file_bytes_ = 0;
  std::vector<StoredTensor> tensors_;
  std::map<std::string, size_t> index_;
};

// CRC-32 of `bytes` bytes at `data`, continuing from `crc` (0 to start).
uint32_t crc32_of(const void* data, int64_t bytes, uint32_t crc = 0);

// Reads a whole safetensors file: name → tensor (CPU). Throws std::runtime_error naming the file and what is wrong
// (truncated, bad header, unknown dtype).
std::map<std::string, torch::Tensor> read_safetensors(const std::string& path);

// "F32", "BF16", "F16", ... as the format spells them, and back (std::invalid_argument for another spelling).
std::string safetensors_dtype(torch::ScalarType dtype);
torch::ScalarType safetensors_scalar_type(const std::string& name);

}  // namespace dscpp
