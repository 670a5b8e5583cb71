// NvmeStore: the optimizer state in one O_DIRECT swap file per rank, swapped through buffer_count host buffers.
#include "dscpp/offload/nvme_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <system_error>

#include "dscpp/monitor/step_log.h"  // format_bytes
#include "dscpp/offload/host_memory.h"

namespace dscpp {
namespace {

namespace fs = std::filesystem;

int64_t round_up(int64_t bytes) {
  const auto a = static_cast<int64_t>(kIoAlignment);
  return (bytes + a - 1) / a * a;
}


class NvmeStoreImpl final : public StateStore {
 public:
  explicit NvmeStoreImpl(const NvmeStoreOptions& o)
      : StateStore(o.sub_group_sizes), options_(o), io_(o.aio, o.backend) {
    element_ = static_cast<int64_t>(c10::elementSize(o.dtype));
    slot_bytes_ = round_up(static_cast<int64_t>(o.kinds) * std::max<int64_t>(largest_sub_group(), 1) * element_);
    open_file();
    const int count = std::max(1, std::min(o.buffer_count, std::max(1, sub_groups())));
    for (int b = 0; b < count; ++b) {
      // Over-allocated by one alignment unit so the O_DIRECT buffer can start on a 4 KiB boundary.
      auto storage = torch::empty({slot_bytes_ + static_cast<int64_t>(kIoAlignment)},
                                  host_options(o.pin_memory).dtype(torch::kByte));
      const auto address = reinterpret_cast<uintptr_t>(storage.data_ptr());
      const auto shift = static_cast<int64_t>((kIoAlignment - address % kIoAlignment) % kIoAlignment);
      buffers_.push_back({storage, storage.narrow(0, shift, slot_bytes_)});
    }
    write_initial_values();
  }

  ~NvmeStoreImpl() override {
    try {
      flush();
      for (auto& b : buffers_) settle(b);
    } catch (...) {
      // The file goes with the process; an I/O error here has nothing left to corrupt.
    }
    if (fd_ >= 0) ::close(fd_);
  }

  SwapStats stats() const override { return stats_; }

  std::vector<torch::Tensor> acquire(int i) override {
    Buffer& b = buffer_for(i);
    if (b.state == State::kReading || b.state == State::kWriting) {
      wait(b.ticket);  // writing: its bytes are this sub-group's latest, so they are used as they are, no read
    }
    b.state = State::kHeld;
    if (options_.read_ahead) prefetch(i + 1);
    return views(b, i);
  }

  void release(int i, bool modified) override {
    Buffer& b = held(i);
    if (!modified) {
      b.state = State::kClean;  // still a valid copy of sub-group i
      return;
    }
    b.ticket = io_.write(fd_, b.data.data_ptr(), static_cast<size_t>(transfer_bytes(i)), offset_of(i), path_);
    stats_.written_bytes += transfer_bytes(i);
    b.state = State::kWriting;
  }

  void flush() override {
    for (auto& b : buffers_) {
      if (b.state == State::kWriting) {
        wait(b.ticket);
        b.state = State::kClean;
      }
    }
  }

 private:
  // A buffer's life: empty → reading (sub-group i) → held by the step → writing back → clean (a valid copy of i).
  enum class State { kEmpty, kReading, kHeld, kWriting, kClean };
  struct Buffer {
    torch::Tensor storage;  // owns the memory
    torch::Tensor data;     // slot_bytes_, 4 KiB aligned
    State state = State::kEmpty;
    int sub_group = -1;
    AsyncIo::Ticket ticket = 0;
  };

  void open_file() {
    const std::string& dir = options_.nvme_path;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      throw std::runtime_error(options_.config_key + " \"" + dir + "\" is not a directory" +
                               (ec ? " (" + ec.message() + ")" : std::string()) +
                               ": give an existing, writable directory on the disk to swap to");
    }
    static std::atomic<int> serial{0};
    path_ = (fs::path(dir) / ("dscpp-" + std::to_string(::getpid()) + "-" + std::to_string(serial++) + "-rank" +
                              std::to_string(options_.rank) + "-" + options_.role + ".swap"))
                .string();
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (fd_ < 0 && errno == EINVAL) {
      // tmpfs and some network file systems have no O_DIRECT: the page cache then stands in for the disk.
      fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    if (fd_ < 0) {
      throw std::runtime_error(options_.config_key + " \"" + dir + "\" is not writable: cannot create " + path_ +
                               ": " + std::strerror(errno));
    }
    // Only the descriptor refers to the file from now on: it is gone when the process is, however it ends.
    ::unlink(path_.c_str());
    const int64_t needed = offset_of(sub_groups() - 1) + slot_bytes_;
    struct statvfs vfs {};
    const int64_t free_bytes =
        ::statvfs(dir.c_str(), &vfs) == 0 ? static_cast<int64_t>(vfs.f_bavail) * static_cast<int64_t>(vfs.f_frsize) : -1;
    const int rc = sub_groups() == 0 ? 0 : ::posix_fallocate(fd_, 0, needed);
    stats_.file_bytes = needed;
    if (rc != 0) {
      ::close(fd_);
      fd_ = -1;
      const std::string free_text = free_bytes >= 0 ? "; " + format_bytes(static_cast<double>(free_bytes)) + " free" : "";
      throw std::runtime_error(options_.config_key + " \"" + dir + "\": cannot reserve " +
                               format_bytes(static_cast<double>(needed)) + " for rank " +
                               std::to_string(options_.rank) + "'s " + options_.role + " state (" +
                               std::strerror(rc) + free_text +
                               "): free space there, point nvme_path at a larger disk, or use more ranks");
    }
  }

  // Sub-group i's slot in the file, and the bytes moved for it (its kinds back to back, rounded up to a block).
  off_t offset_of(int i) const { return static_cast<off_t>(i) * slot_bytes_; }
  int64_t transfer_bytes(int i) const {
    return round_up(static_cast<int64_t>(options_.kinds) * sub_group_numel(i) * element_);
  }

  std::vector<torch::Tensor> views(Buffer& b, int i) {
    std::vector<torch::Tensor> out;
    const int64_t n = sub_group_numel(i);
    for (int k = 0; k < options_.kinds; ++k) out.push_back(b.data.narrow(0, k * n * element_, n * element_).view(options_.dtype));
    return out;
  }

  Buffer& held(int i) {
    for (auto& b : buffers_) {
      if (b.state == State::kHeld && b.sub_group == i) return b;
    }
    throw std::logic_error("NvmeStore: release(" + std::to_string(i) + ") of a sub-group not acquired");
  }

  // Waits for whatever a buffer is doing and leaves it a clean copy (or empty).
  void settle(Buffer& b) {
    if (b.state == State::kReading || b.state == State::kWriting) {
      wait(b.ticket);
      b.state = State::kClean;
    }
  }

  void wait(AsyncIo::Ticket ticket) {
    const auto start = std::chrono::steady_clock::now();
    io_.wait(ticket);
    stats_.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // The buffer holding sub-group i (read ahead, being written, or still clean), else a free one reading it now.
  Buffer& buffer_for(int i) {
    for (auto& b : buffers_) {
      if (b.sub_group == i && b.state != State::kEmpty) {
        if (b.state == State::kHeld) throw std::logic_error("NvmeStore: sub-group acquired twice");
        return b;
      }
    }
    Buffer& b = free_buffer();
    start_read(b, i);
    return b;
  }

  void prefetch(int i) override {
    if (i < 0 || i >= sub_groups()) return;
    for (auto& b : buffers_) {
      if (b.sub_group == i && b.state != State::kEmpty) return;  // already here or on its way
    }
    // A spare buffer, else the oldest write-back (issued a sub-group or more ago, so most likely finished). With a
    // single buffer nothing is spare: acquire(i) reads it then.
    Buffer* spare = nullptr;
    for (auto& b : buffers_) {
      if (b.state == State::kEmpty || b.state == State::kClean) spare = &b;
    }
    for (auto& b : buffers_) {
      if (spare == nullptr && b.state == State::kWriting) spare = &b;
      if (spare != nullptr && spare->state == State::kWriting && b.state == State::kWriting && b.ticket < spare->ticket) {
        spare = &b;
      }
    }
    if (spare == nullptr) return;
    settle(*spare);
    start_read(*spare, i);
  }

  void start_read(Buffer& b, int i) {
    b.sub_group = i;
    b.ticket = io_.read(fd_, b.data.data_ptr(), static_cast<size_t>(transfer_bytes(i)), offset_of(i), path_);
    stats_.read_bytes += transfer_bytes(i);
    b.state = State::kReading;
  }

  // An empty or clean buffer; else the oldest write-back or stale read-ahead finished first.
  Buffer& free_buffer() {
    for (auto& b : buffers_) {
      if (b.state == State::kEmpty || b.state == State::kClean) return b;
    }
    for (auto& b : buffers_) {
      if (b.state == State::kWriting || b.state == State::kReading) {
        settle(b);
        return b;
      }
    }
    throw std::logic_error("NvmeStore: every buffer is held (buffer_count " + std::to_string(buffers_.size()) + ")");
  }

  void write_initial_values() {
    for (int i = 0; i < sub_groups(); ++i) {
      Buffer& b = free_buffer();
      b.sub_group = i;
      b.state = State::kHeld;
      if (options_.initial_values) options_.initial_values(i, views(b, i));
      release(i, true);
    }
    flush();
  }

  NvmeStoreOptions options_;
  AsyncIo io_;
  std::string path_;
  int fd_ = -1;
  int64_t element_ = 4;      // bytes per element
  int64_t slot_bytes_ = 0;   // a sub-group's place in the file and in a buffer: the largest, block aligned
  std::vector<Buffer> buffers_;
  SwapStats stats_;
};

}  // namespace

std::unique_ptr<StateStore> make_nvme_store(const NvmeStoreOptions& options) {
  return std::make_unique<NvmeStoreImpl>(options);
}

}  // namespace dscpp
