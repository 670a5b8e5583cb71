// A safetensors file (a checkpoint shard, --init_from weights): the header's length, JSON and tensor table, then
// every tensor read. The reader takes a path, so the bytes go to a memfd (no disk) named by /proc/self/fd.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "dscpp/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0) return 0;
  size_t written = 0;
  while (written < size) {
    const ssize_t n = ::write(fd, data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  try {
    dscpp::SafetensorsReader reader("/proc/self/fd/" + std::to_string(fd));
    for (const auto& tensor : reader.tensors()) (void)reader.read(tensor.info.name);
  } catch (const std::exception& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
  }
  ::close(fd);
  return 0;
}
