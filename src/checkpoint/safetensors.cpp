// Safetensors: streaming writer and whole-file reader.
#include "dscpp/checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace dscpp {
namespace {

const std::vector<std::pair<torch::ScalarType, std::string>>& dtype_names() {
  static const std::vector<std::pair<torch::ScalarType, std::string>> names = {
      {torch::kFloat64, "F64"}, {torch::kFloat32, "F32"}, {torch::kBFloat16, "BF16"}, {torch::kFloat16, "F16"},
      {torch::kInt64, "I64"},   {torch::kInt32, "I32"},   {torch::kInt16, "I16"},     {torch::kInt8, "I8"},
      {torch::kUInt8, "U8"},    {torch::kBool, "BOOL"}};
  return names;
}

torch::ScalarType parse_dtype(const std::string& name, const std::string& path) {
  for (const auto& [type, spelled] : dtype_names())
    if (spelled == name) return type;
  throw std::runtime_error(path + ": unsupported safetensors dtype '" + name + "'");
}

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const char* data, int64_t bytes, int64_t offset, const std::string& path) {
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd, data, static_cast<size_t>(bytes), offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(path + ": write failed: " + errno_text());
    }
    data += n;
    bytes -= n;
    offset += n;
  }
}

}  // namespace

std::string safetensors_dtype(torch::ScalarType dtype) {
  for (const auto& [type, name] : dtype_names())
    if (type == dtype) return name;
  throw std::invalid_argument(std::string("safetensors: no spelling for dtype ") + c10::toString(dtype));
}

SafetensorsWriter::SafetensorsWriter(std::string path, const std::vector<TensorInfo>& tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), temp_path_(path_ + ".tmp." + std::to_string(::getpid())) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& info : tensors) {
    int64_t numel = 1;
    for (int64_t d : info.shape) numel *= d;
    Entry entry{info, offset, numel * static_cast<int64_t>(c10::elementSize(info.dtype))};
    if (!entries_.emplace(info.name, entry).second) {
      throw std::invalid_argument(path_ + ": tensor '" + info.name + "' declared twice");
    }
    header[info.name] = {{"dtype", safetensors_dtype(info.dtype)},
                         {"shape", info.shape},
                         {"data_offsets", {entry.begin, entry.begin + entry.bytes}}};
    offset += entry.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned, as the format suggests
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path_ + ": cannot create " + temp_path_ + ": " + errno_text());
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  write_all(fd_, reinterpret_cast<const char*>(length), 8, 0, path_);
  write_all(fd_, text.data(), static_cast<int64_t>(text.size()), 8, path_);
  data_start_ = 8 + static_cast<int64_t>(text.size());
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_path_.c_str());
  }
}

void SafetensorsWriter::write(const std::string& name, const torch::Tensor& tensor) {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw std::invalid_argument(path_ + ": tensor '" + name + "' was not declared");
  auto& entry = it->second;
  if (tensor.sizes().vec() != entry.info.shape) {
    throw std::invalid_argument(path_ + ": tensor '" + name + "' has shape " + c10::str(tensor.sizes()) +
                                ", declared " + c10::str(c10::IntArrayRef(entry.info.shape)));
  }
  const auto host = tensor.detach().to(torch::kCPU, entry.info.dtype).contiguous();
  write_all(fd_, static_cast<const char*>(host.data_ptr()), entry.bytes, data_start_ + entry.begin, path_);
  entry.written = true;
}

void SafetensorsWriter::close() {
  for (const auto& [name, entry] : entries_) {
    if (!entry.written) throw std::logic_error(path_ + ": tensor '" + name + "' was declared but never written");
  }
  if (::fsync(fd_) != 0) throw std::runtime_error(path_ + ": fsync failed: " + errno_text());
  ::close(fd_);
  fd_ = -1;
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const auto why = errno_text();
    ::unlink(temp_path_.c_str());
    throw std::runtime_error(path_ + ": cannot move the finished file into place: " + why);
  }
}

std::map<std::string, torch::Tensor> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  in.seekg(0);
  uint8_t length[8];
  if (size < 8 || !in.read(reinterpret_cast<char*>(length), 8)) throw std::runtime_error(path + ": truncated header");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length[i];
  if (header_bytes > static_cast<uint64_t>(size - 8)) throw std::runtime_error(path + ": header length past the end");
  std::string text(header_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_bytes));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": bad JSON header: " + e.what());
  }
  const int64_t data_start = 8 + static_cast<int64_t>(header_bytes);
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const auto dtype = parse_dtype(entry.at("dtype").get<std::string>(), path);
    const auto shape = entry.at("shape").get<std::vector<int64_t>>();
    const auto range = entry.at("data_offsets").get<std::vector<int64_t>>();
    auto tensor = torch::empty(shape, torch::TensorOptions().dtype(dtype));
    if (range.size() != 2 || range[1] - range[0] != static_cast<int64_t>(tensor.nbytes()) ||
        data_start + range[1] > size) {
      throw std::runtime_error(path + ": tensor '" + name + "' byte range is wrong or past the end (file truncated?)");
    }
    in.seekg(data_start + range[0]);
    in.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(tensor.nbytes()));
    out.emplace(name, tensor);
  }
  return out;
}

}  // namespace dscpp
