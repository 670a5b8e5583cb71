// AsyncIo: the I/O thread and the two kernel interfaces it can drive.
#include "dscpp/offload/async_io.h"

#include <libaio.h>
#include <liburing.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

#include "dscpp/fault/kill_point.h"

namespace dscpp {

// Blocks in flight in the kernel, each tagged with its transfer; reap() returns finished ones.
class AsyncIo::Kernel {
 public:
  struct Done {
    Ticket ticket;
    long result;    // bytes, or -errno
    size_t wanted;  // bytes asked for
  };
  virtual ~Kernel() = default;
  virtual std::string name() const = 0;
  // Queues one block; flush() hands queued blocks to the kernel.
  virtual void queue(bool write, int fd, char* buffer, size_t bytes, off_t offset, Ticket ticket) = 0;
  virtual void flush() = 0;
  // Waits for at least one completion.
  virtual void reap(std::vector<Done>& out) = 0;
};

namespace {

// Each block carries its ticket and size through the kernel.
struct Tag {
  AsyncIo::Ticket ticket;
  size_t bytes;
};

class IoUring final : public AsyncIo::Kernel {
 public:
  explicit IoUring(unsigned depth) {
    const int rc = io_uring_queue_init(depth, &ring_, 0);
    if (rc < 0) throw std::system_error(-rc, std::generic_category(), "io_uring_queue_init");
  }
  ~IoUring() override { io_uring_queue_exit(&ring_); }
  std::string name() const override { return "io_uring"; }

  void queue(bool write, int fd, char* buffer, size_t bytes, off_t offset, AsyncIo::Ticket ticket) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) throw std::logic_error("io_uring: more blocks queued than the queue depth");
    if (write) {
      io_uring_prep_write(sqe, fd, buffer, static_cast<unsigned>(bytes), offset);
    } else {
      io_uring_prep_read(sqe, fd, buffer, static_cast<unsigned>(bytes), offset);
    }
    io_uring_sqe_set_data(sqe, new Tag{ticket, bytes});
  }

  void flush() override {
    const int rc = io_uring_submit(&ring_);
    if (rc < 0) throw std::system_error(-rc, std::generic_category(), "io_uring_submit");
  }

  void reap(std::vector<Done>& out) override {
    io_uring_cqe* cqe = nullptr;
    int rc = io_uring_wait_cqe(&ring_, &cqe);
    while (rc == -EINTR) rc = io_uring_wait_cqe(&ring_, &cqe);
    if (rc < 0) throw std::system_error(-rc, std::generic_category(), "io_uring_wait_cqe");
    while (cqe != nullptr) {
      auto* tag = static_cast<Tag*>(io_uring_cqe_get_data(cqe));
      out.push_back({tag->ticket, cqe->res, tag->bytes});
      delete tag;
      io_uring_cqe_seen(&ring_, cqe);
      cqe = nullptr;
      if (io_uring_peek_cqe(&ring_, &cqe) != 0) break;
    }
  }

 private:
  io_uring ring_{};
};

class LinuxAio final : public AsyncIo::Kernel {
 public:
  explicit LinuxAio(unsigned depth) : depth_(depth) {
    const int rc = io_setup(static_cast<int>(depth), &context_);
    if (rc < 0) throw std::system_error(-rc, std::generic_category(), "io_setup");
  }
  ~LinuxAio() override { io_destroy(context_); }
  std::string name() const override { return "libaio"; }

  void queue(bool write, int fd, char* buffer, size_t bytes, off_t offset, AsyncIo::Ticket ticket) override {
    auto* cb = new iocb{};
    if (write) {
      io_prep_pwrite(cb, fd, buffer, bytes, offset);
    } else {
      io_prep_pread(cb, fd, buffer, bytes, offset);
    }
    cb->data = new Tag{ticket, bytes};
    queued_.push_back(cb);
  }

  void flush() override {
    size_t sent = 0;
    while (sent < queued_.size()) {
      const int rc = io_submit(context_, static_cast<long>(queued_.size() - sent), queued_.data() + sent);
      if (rc == -EINTR || rc == -EAGAIN) continue;
      if (rc < 0) throw std::system_error(-rc, std::generic_category(), "io_submit");
      sent += static_cast<size_t>(rc);
    }
    queued_.clear();
  }

  void reap(std::vector<Done>& out) override {
    std::vector<io_event> events(depth_);
    int rc = io_getevents(context_, 1, static_cast<long>(depth_), events.data(), nullptr);
    while (rc == -EINTR) rc = io_getevents(context_, 1, static_cast<long>(depth_), events.data(), nullptr);
    if (rc < 0) throw std::system_error(-rc, std::generic_category(), "io_getevents");
    for (int i = 0; i < rc; ++i) {
      auto* tag = static_cast<Tag*>(events[i].data);
      out.push_back({tag->ticket, static_cast<long>(events[i].res), tag->bytes});
      delete tag;
      delete events[i].obj;
    }
  }

 private:
  unsigned depth_;
  io_context_t context_ = nullptr;
  std::vector<iocb*> queued_;
};

std::unique_ptr<AsyncIo::Kernel> make_kernel(IoBackend backend, unsigned depth) {
  if (backend == IoBackend::kLibaio) return std::make_unique<LinuxAio>(depth);
  if (backend == IoBackend::kIoUring) return std::make_unique<IoUring>(depth);
  try {
    return std::make_unique<IoUring>(depth);
  } catch (const std::system_error&) {
    // Kernels before 5.1, io_uring_disabled, or a seccomp profile that blocks it (many container runtimes).
    return std::make_unique<LinuxAio>(depth);
  }
}

bool aligned(uint64_t value) { return value % kIoAlignment == 0; }

}  // namespace

AsyncIo::AsyncIo(const AioConfig& config, IoBackend backend) : config_(config) {
  if (config_.block_size <= 0 || !aligned(static_cast<uint64_t>(config_.block_size)) || config_.queue_depth < 1 ||
      config_.intra_op_parallelism < 1) {
    throw std::invalid_argument("aio.block_size must be a positive multiple of " + std::to_string(kIoAlignment) +
                                ", aio.queue_depth and aio.intra_op_parallelism >= 1, got " +
                                std::to_string(config_.block_size) + ", " + std::to_string(config_.queue_depth) +
                                " and " + std::to_string(config_.intra_op_parallelism));
  }
  for (int i = 0; i < config_.intra_op_parallelism; ++i) {
    kernels_.push_back(make_kernel(backend, static_cast<unsigned>(config_.queue_depth)));
  }
  stats_.threads = config_.intra_op_parallelism;
  threads_.reserve(kernels_.size());
  try {
    for (size_t i = 0; i < kernels_.size(); ++i) threads_.emplace_back([this, i] { run(*kernels_[i]); });
  } catch (...) {
    // A thread that cannot start (EAGAIN under a process or thread limit) must not leave the ones started joinable:
    // destroying a joinable std::thread while this exception unwinds would std::terminate the process.
    stop_threads();
    throw;
  }
}

void AsyncIo::stop_threads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (auto& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
}

AsyncIo::~AsyncIo() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] {
      for (const auto& [ticket, t] : transfers_) {
        if (!t.done) return false;
      }
      return true;
    });
  }
  stop_threads();
}

std::string AsyncIo::backend() const { return kernels_.front()->name(); }

AsyncIo::Stats AsyncIo::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

AsyncIo::Ticket AsyncIo::read(int fd, void* buffer, size_t bytes, off_t offset, const std::string& what) {
  return enqueue({false, fd, static_cast<char*>(buffer), bytes, offset, what});
}

AsyncIo::Ticket AsyncIo::write(int fd, const void* buffer, size_t bytes, off_t offset, const std::string& what) {
  return enqueue({true, fd, static_cast<char*>(const_cast<void*>(buffer)), bytes, offset, what});
}

AsyncIo::Ticket AsyncIo::enqueue(Transfer transfer) {
  fault::kill_point("swap.io");
  if (!aligned(reinterpret_cast<uintptr_t>(transfer.buffer)) || !aligned(transfer.bytes) ||
      !aligned(static_cast<uint64_t>(transfer.offset))) {
    throw std::invalid_argument("AsyncIo: " + transfer.what + ": buffer, length and offset must be multiples of " +
                                std::to_string(kIoAlignment) + " bytes for O_DIRECT");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const Ticket ticket = next_ticket_++;
  transfer.done = transfer.bytes == 0;
  transfers_.emplace(ticket, std::move(transfer));
  if (!transfers_.at(ticket).done) pending_.push_back(ticket);
  changed_.notify_all();
  return ticket;
}

void AsyncIo::wait(Ticket ticket) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = transfers_.find(ticket);
  if (it == transfers_.end()) throw std::logic_error("AsyncIo::wait: unknown or already waited ticket");
  changed_.wait(lock, [&] { return it->second.done; });
  const Transfer t = std::move(it->second);
  transfers_.erase(it);
  if (t.error != 0) {
    throw std::system_error(t.error, std::generic_category(),
                            std::string(t.write ? "writing " : "reading ") + std::to_string(t.bytes) + " bytes at " +
                                std::to_string(t.offset) + " of " + t.what);
  }
}

// One I/O thread (of aio.intra_op_parallelism): hands blocks of pending transfers to its kernel queue up to the
// queue depth, and retires completions. The threads share the pending transfers, so one large transfer is split
// over all of them. aio.single_submit hands each block to the kernel on its own (one submission call per block);
// aio.overlap_events false submits a batch and waits for all of it before the next, as DeepSpeed's
// non-overlapped mode does.
void AsyncIo::run(Kernel& kernel) {
  const size_t depth = static_cast<size_t>(config_.queue_depth);
  const size_t block = static_cast<size_t>(config_.block_size);
  size_t in_kernel = 0;
  std::vector<Kernel::Done> done;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || !pending_.empty() || in_kernel > 0; });
      if (stopping_ && pending_.empty() && in_kernel == 0) return;
      const bool may_queue = config_.overlap_events || in_kernel == 0;
      size_t queued = 0;
      while (may_queue && in_kernel + queued < depth && !pending_.empty()) {
        Transfer& t = transfers_.at(pending_.front());
        const size_t bytes = std::min(block, t.bytes - t.next);
        kernel.queue(t.write, t.fd, t.buffer + t.next, bytes, t.offset + static_cast<off_t>(t.next), pending_.front());
        t.next += bytes;
        ++t.outstanding;
        ++queued;
        ++stats_.blocks;
        if (t.next == t.bytes) pending_.pop_front();
        if (config_.single_submit) {
          kernel.flush();
          ++stats_.submissions;
        }
      }
      if (queued > 0 && !config_.single_submit) {
        kernel.flush();
        ++stats_.submissions;
      }
      in_kernel += queued;
      stats_.max_in_kernel = std::max<int64_t>(stats_.max_in_kernel, static_cast<int64_t>(in_kernel));
      if (in_kernel == 0) continue;
    }
    done.clear();
    kernel.reap(done);  // outside the lock: callers queue and wait meanwhile
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& d : done) {
      --in_kernel;
      Transfer& t = transfers_.at(d.ticket);
      --t.outstanding;
      if (t.error == 0 && d.result < 0) t.error = static_cast<int>(-d.result);
      if (t.error == 0 && static_cast<size_t>(d.result) != d.wanted) t.error = EIO;  // short: past the end
      t.done = t.next == t.bytes && t.outstanding == 0;
    }
    changed_.notify_all();
  }
}

}  // namespace dscpp
