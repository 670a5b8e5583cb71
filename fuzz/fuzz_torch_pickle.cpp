// A torch.save file's pickle (what `dscpp convert --from deepspeed` reads from DeepSpeed's checkpoints): the input is
// the pickle's bytes, put into a torch.save archive beside one storage record (data/0, 64 bytes) so the tensor
// opcodes have something to view. The reader takes a path, so the archive goes to a memfd named by /proc/self/fd.
#include <caffe2/serialize/inline_container.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "dscpp/checkpoint/torch_pickle.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("fuzz.pt", MFD_CLOEXEC);
  if (fd < 0) return 0;
  {
    caffe2::serialize::PyTorchStreamWriter writer([fd](const void* bytes, size_t n) -> size_t {
      return ::write(fd, bytes, n) == static_cast<ssize_t>(n) ? n : 0;
    });
    const char storage[64] = {};
    writer.writeRecord("data.pkl", data, size);
    writer.writeRecord("data/0", storage, sizeof(storage));
    writer.writeEndOfFile();
  }
  try {
    dscpp::load_torch_file("/proc/self/fd/" + std::to_string(fd));
  } catch (const std::exception& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
  }
  ::close(fd);
  return 0;
}
