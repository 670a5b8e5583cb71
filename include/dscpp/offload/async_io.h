// AsyncIo: whole-buffer reads and writes of O_DIRECT files that run in the background while the caller computes
// (ZeRO-Infinity's swapping). aio.intra_op_parallelism I/O threads split each transfer into blocks of
// aio.block_size bytes and keep aio.queue_depth of them each in flight in the kernel, through io_uring (liburing)
// or, where the kernel or a sandbox refuses io_uring, Linux AIO (libaio); aio.single_submit and aio.overlap_events
// choose how blocks are handed over (see run()).
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dscpp/config/config.h"

namespace dscpp {

// O_DIRECT alignment of every buffer, length and offset (AioConfig::kAlignment).
constexpr size_t kIoAlignment = AioConfig::kAlignment;

enum class IoBackend { kAuto, kIoUring, kLibaio };

class AsyncIo {
 public:
  // kAuto tries io_uring first. Throws std::system_error when the chosen backend cannot start.
  explicit AsyncIo(const AioConfig& config, IoBackend backend = IoBackend::kAuto);
  ~AsyncIo();  // waits for every transfer queued
  AsyncIo(const AsyncIo&) = delete;
  AsyncIo& operator=(const AsyncIo&) = delete;

  std::string backend() const;  // "io_uring" or "libaio"

  // What the I/O threads did so far: how the aio knobs took effect.
  struct Stats {
    int threads = 0;            // aio.intra_op_parallelism
    int64_t blocks = 0;         // blocks handed to the kernel
    int64_t submissions = 0;    // submission calls (io_uring_submit / io_submit)
    int64_t max_in_kernel = 0;  // most blocks one thread had in the kernel at once
  };
  Stats stats() const;

  using Ticket = uint64_t;
  // Queues a transfer of `bytes` between `buffer` and `fd` at `offset`, all multiples of kIoAlignment (the buffer
  // an address); `what` names it in errors (a file path). The buffer must stay alive until wait().
  Ticket read(int fd, void* buffer, size_t bytes, off_t offset, const std::string& what);
  Ticket write(int fd, const void* buffer, size_t bytes, off_t offset, const std::string& what);
  // Blocks until the transfer completed; throws std::system_error naming it and the errno when any block failed
  // (ENOSPC: the disk is full) or came back short.
  void wait(Ticket ticket);

  // Internal: the kernel interface (io_uring or libaio) the I/O thread drives.
  class Kernel;

 private:
  struct Transfer {
    bool write = false;
    int fd = -1;
    char* buffer = nullptr;
    size_t bytes = 0;
    off_t offset = 0;
    std::string what;
    size_t next = 0;          // bytes handed to the kernel so far
    size_t outstanding = 0;   // blocks in the kernel
    int error = 0;            // first errno (EIO for a short transfer)
    bool done = false;
  };
  Ticket enqueue(Transfer transfer);
  void run(Kernel& kernel);
  void stop_threads();  // tells the I/O threads to stop and joins the ones started

  AioConfig config_;
  std::vector<std::unique_ptr<Kernel>> kernels_;  // one per I/O thread
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<Ticket, Transfer> transfers_;  // queued, running and finished-but-not-waited
  std::deque<Ticket> pending_;            // with blocks still to hand to the kernel, oldest first
  Ticket next_ticket_ = 1;
  bool stopping_ = false;
  Stats stats_;
  std::vector<std::thread> threads_;
};

}  // namespace dscpp
