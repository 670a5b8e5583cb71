// Safetensors: streaming writer and whole-file reader.
#include "dscpp/checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <zlib.h>

namespace dscpp {
namespace {

const std::vector<std::pair<torch::ScalarType, std::string>>& dtype_names() {
  static const std::vector<std::pair<torch::ScalarType, std::string>> names = {
      {torch::kFloat64, "F64"}, {torch::kFloat32, "F32"}, {torch::kBFloat16, "BF16"}, {torch::kFloat16, "F16"},
      {torch::kInt64, "I64"},   {torch::kInt32, "I32"},   {torch::kInt16, "I16"},     {torch::kInt8, "I8"},
      {torch::kUInt8, "U8"},    {torch::kBool, "BOOL"}};
  return names;
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

uint32_t crc32_of(const void* data, int64_t bytes, uint32_t crc) {
  // zlib takes uInt lengths: feed it in pieces below 4 GiB.
  const auto* p = static_cast<const Bytef*>(data);
  uLong value = crc;
  while (bytes > 0) {
    const auto n = static_cast<uInt>(std::min<int64_t>(bytes, int64_t{1} << 30));
    value = ::crc32(value, p, n);
    p += n;
    bytes -= n;
  }
  return static_cast<uint32_t>(value);
}

std::string safetensors_dtype(torch::ScalarType dtype) {
  for (const auto& [type, name] : dtype_names())
    if (type == dtype) return name;
  throw std::invalid_argument(std::string("safetensors: no spelling for dtype ") + c10::toString(dtype));
}

torch::ScalarType safetensors_scalar_type(const std::string& name) {
  for (const auto& [type, spelled] : dtype_names())
    if (spelled == name) return type;
  throw std::invalid_argument("unsupported safetensors dtype '" + name + "'");
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
  // Never through a link someone planted at the temporary name: a stale file of ours is removed, then the name must
  // be new (O_EXCL) and not a symbolic link (O_NOFOLLOW).
  ::unlink(temp_path_.c_str());
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path_ + ": cannot create " + temp_path_ + ": " + errno_text());
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  write_all(fd_, reinterpret_cast<const char*>(length), 8, 0, path_);
  write_all(fd_, text.data(), static_cast<int64_t>(text.size()), 8, path_);
  data_start_ = 8 + static_cast<int64_t>(text.size());
  header_crc_ = crc32_of(text.data(), static_cast<int64_t>(text.size()), crc32_of(length, 8));
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
  // The checksum is computed on another thread while the bytes go to the file: both only read `host`, and on a
  // large tensor this hides the CRC's time behind the write. Small ones are not worth a thread.
  constexpr int64_t kCrcThreadBytes = int64_t{1} << 20;
  if (entry.bytes >= kCrcThreadBytes) {
    auto crc = std::async(std::launch::async, [&host, bytes = entry.bytes] { return crc32_of(host.data_ptr(), bytes); });
    write_all(fd_, static_cast<const char*>(host.data_ptr()), entry.bytes, data_start_ + entry.begin, path_);
    entry.crc = crc.get();
  } else {
    write_all(fd_, static_cast<const char*>(host.data_ptr()), entry.bytes, data_start_ + entry.begin, path_);
    entry.crc = crc32_of(host.data_ptr(), entry.bytes);
  }
  entry.written = true;
}

void SafetensorsWriter::close() {
  for (const auto& [name, entry] : entries_) {
    if (!entry.written) throw std::logic_error(path_ + ": tensor '" + name + "' was declared but never written");
  }
  // The whole file's CRC from its pieces, in file order, without reading anything back.
  std::vector<const Entry*> in_order;
  for (const auto& [name, entry] : entries_) in_order.push_back(&entry);
  std::sort(in_order.begin(), in_order.end(), [](const Entry* a, const Entry* b) { return a->begin < b->begin; });
  uLong crc = header_crc_;
  for (const Entry* entry : in_order) crc = ::crc32_combine(crc, entry->crc, static_cast<z_off_t>(entry->bytes));
  file_crc_ = static_cast<uint32_t>(crc);
  file_bytes_ = data_start_ + (in_order.empty() ? 0 : in_order.back()->begin + in_order.back()->bytes);
  if (::fsync(fd_) != 0) throw std::runtime_error(path_ + ": fsync failed: " + errno_text());
  ::close(fd_);
  fd_ = -1;
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const auto why = errno_text();
    ::unlink(temp_path_.c_str());
    throw std::runtime_error(path_ + ": cannot move the finished file into place: " + why);
  }
}

uint32_t SafetensorsWriter::tensor_crc32(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw std::invalid_argument(path_ + ": tensor '" + name + "' was not declared");
  return it->second.crc;
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw std::runtime_error(path_ + ": cannot open: " + errno_text());
  try {
    file_bytes_ = ::lseek(fd_, 0, SEEK_END);
    uint8_t length[8];
    if (file_bytes_ < 8 || ::pread(fd_, length, 8, 0) != 8) {
      throw std::runtime_error(path_ + ": truncated: " + std::to_string(file_bytes_) + " bytes, no header");
    }
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length[i];
    if (header_bytes > static_cast<uint64_t>(file_bytes_ - 8)) {
      throw std::runtime_error(path_ + ": truncated or not safetensors: the header claims " +
                               std::to_string(header_bytes) + " bytes, the file has " + std::to_string(file_bytes_));
    }
    std::string text(header_bytes, '\0');
    if (::pread(fd_, text.data(), header_bytes, 8) != static_cast<ssize_t>(header_bytes)) {
      throw std::runtime_error(path_ + ": cannot read the header: " + errno_text());
    }
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      throw std::runtime_error(path_ + ": bad JSON header: " + e.what());
    }
    if (!header.is_object()) throw std::runtime_error(path_ + ": bad header: not a JSON object");
    const int64_t data_start = 8 + static_cast<int64_t>(header_bytes);
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      StoredTensor stored;
      std::vector<int64_t> range;
      try {
        stored.info = {name, safetensors_scalar_type(entry.at("dtype").get<std::string>()),
                       entry.at("shape").get<std::vector<int64_t>>()};
        range = entry.at("data_offsets").get<std::vector<int64_t>>();
      } catch (const nlohmann::json::exception& e) {
        throw std::runtime_error(path_ + ": bad header entry for '" + name + "': " + e.what());
      } catch (const std::invalid_argument& e) {  // a dtype the format does not have
        throw std::runtime_error(path_ + ": " + e.what());
      }
      int64_t numel = 1;
      for (int64_t d : stored.info.shape) {
        // Anything larger than the file could not be in it; checked before multiplying so nothing overflows.
        if (d < 0 || (d > 0 && numel > file_bytes_ / d)) {
          throw std::runtime_error(path_ + ": tensor '" + name + "' has an impossible shape (larger than the file)");
        }
        numel *= d;
      }
      stored.bytes = numel * static_cast<int64_t>(c10::elementSize(stored.info.dtype));
      if (range.size() != 2 || range[0] < 0 || range[1] < range[0] || range[1] - range[0] != stored.bytes) {
        throw std::runtime_error(path_ + ": tensor '" + name + "': data_offsets do not match its dtype and shape");
      }
      if (range[1] > file_bytes_ - data_start) {
        throw std::runtime_error(path_ + ": truncated: tensor '" + name + "' ends at data byte " +
                                 std::to_string(range[1]) + " but the file holds " +
                                 std::to_string(file_bytes_ - data_start) + " data bytes");
      }
      stored.offset = data_start + range[0];
      tensors_.push_back(std::move(stored));
    }
    std::sort(tensors_.begin(), tensors_.end(),
              [](const StoredTensor& a, const StoredTensor& b) { return a.offset < b.offset; });
    for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].info.name, i);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() { ::close(fd_); }

const StoredTensor& SafetensorsReader::tensor(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw std::runtime_error(path_ + ": has no tensor '" + name + "'");
  return tensors_[it->second];
}

torch::Tensor SafetensorsReader::read(const std::string& name, std::optional<uint32_t> expected_crc32) const {
  const auto& stored = tensor(name);
  auto out = torch::empty(stored.info.shape, torch::TensorOptions().dtype(stored.info.dtype));
  read_into(name, out, expected_crc32);
  return out;
}

void SafetensorsReader::read_into(const std::string& name, torch::Tensor& out,
                                  std::optional<uint32_t> expected_crc32) const {
  const auto& stored = tensor(name);
  if (!out.is_contiguous() || !out.device().is_cpu() || out.scalar_type() != stored.info.dtype ||
      static_cast<int64_t>(out.nbytes()) != stored.bytes) {
    throw std::invalid_argument(path_ + ": tensor '" + name + "' cannot be read into a " +
                                std::string(c10::toString(out.scalar_type())) + " tensor of " +
                                std::to_string(out.numel()) + " elements");
  }
  auto* dst = static_cast<char*>(out.data_ptr());
  int64_t done = 0;
  while (done < stored.bytes) {
    const ssize_t n = ::pread(fd_, dst + done, static_cast<size_t>(stored.bytes - done), stored.offset + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw std::runtime_error(path_ + ": cannot read tensor '" + name + "': " +
                               (n < 0 ? errno_text() : std::string("unexpected end of file")));
    }
    done += n;
  }
  if (expected_crc32) {
    const uint32_t crc = crc32_of(dst, stored.bytes);
    if (crc != *expected_crc32) {
      throw std::runtime_error(path_ + ": checksum mismatch in tensor '" + name + "' (crc32 " + std::to_string(crc) +
                               ", the manifest says " + std::to_string(*expected_crc32) + "): the file is corrupt");
    }
  }
}

std::map<std::string, torch::Tensor> read_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& stored : reader.tensors()) out.emplace(stored.info.name, reader.read(stored.info.name));
  return out;
}

}  // namespace dscpp
