// bench_nvme_swap: the NVMe optimizer store's sustained throughput against raw O_DIRECT I/O on the same disk in the
// same run (SPEC §6: >= 80%). Raw is dd-style: one thread, sequential pwrite/pread of aio.block_size pieces on an
// O_DIRECT file (`dd oflag=direct bs=1M`). The store moves the same bytes as the optimizer step does: the initial
// fill (write), a sweep that only reads, and a sweep that reads each sub-group ahead and writes it back behind.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "dscpp/offload/nvme_store.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Sequential O_DIRECT writes then reads of `bytes` in `block` pieces; returns {write s, read s}.
std::pair<double, double> raw_direct(const std::string& dir, int64_t bytes, int64_t block) {
  const std::string path = dir + "/raw_direct.bin";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
  if (fd < 0) throw std::runtime_error("cannot open " + path + " with O_DIRECT");
  ::unlink(path.c_str());
  void* buffer = nullptr;
  if (posix_memalign(&buffer, dscpp::kIoAlignment, static_cast<size_t>(block)) != 0) throw std::bad_alloc();
  std::memset(buffer, 7, static_cast<size_t>(block));
  auto start = Clock::now();
  for (int64_t at = 0; at < bytes; at += block) {
    if (::pwrite(fd, buffer, static_cast<size_t>(block), at) != block) throw std::runtime_error("raw pwrite failed");
  }
  ::fdatasync(fd);
  const double write_s = seconds_since(start);
  start = Clock::now();
  for (int64_t at = 0; at < bytes; at += block) {
    if (::pread(fd, buffer, static_cast<size_t>(block), at) != block) throw std::runtime_error("raw pread failed");
  }
  const double read_s = seconds_since(start);
  ::close(fd);
  free(buffer);
  return {write_s, read_s};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_nvme_swap: the NVMe optimizer store's GB/s against raw O_DIRECT GB/s"};
  std::string dir = std::filesystem::temp_directory_path().string();
  double gib = 2.0;
  int64_t sub_group = 10'000'000;
  int buffer_count = 4;
  dscpp::AioConfig aio;
  std::string backend = "auto";
  app.add_option("--dir", dir, "directory on the disk to measure (nvme_path)");
  app.add_option("--gib", gib, "bytes of optimizer state (master + Adam's two moments), GiB");
  app.add_option("--sub_group_size", sub_group, "elements per sub-group");
  app.add_option("--buffer_count", buffer_count, "offload_optimizer.buffer_count");
  app.add_option("--block_size", aio.block_size, "aio.block_size, bytes");
  app.add_option("--queue_depth", aio.queue_depth, "aio.queue_depth");
  app.add_option("--backend", backend, "auto | io_uring | libaio")->check(CLI::IsMember({"auto", "io_uring", "libaio"}));
  CLI11_PARSE(app, argc, argv);

  const int kinds = 3;
  const auto bytes = static_cast<int64_t>(gib * (1 << 30));
  dscpp::NvmeStoreOptions o;
  o.nvme_path = dir;
  o.config_key = "--dir";
  const int64_t numel = bytes / (4 * kinds);
  o.sub_group_sizes = dscpp::uniform_sub_groups(numel, sub_group);
  o.kinds = kinds;
  o.buffer_count = buffer_count;
  o.aio = aio;
  o.backend = backend == "io_uring" ? dscpp::IoBackend::kIoUring
              : backend == "libaio" ? dscpp::IoBackend::kLibaio
                                    : dscpp::IoBackend::kAuto;
  o.initial_values = [](int, const std::vector<torch::Tensor>& slices) {
    for (const auto& s : slices) s.fill_(1.0f);
  };
  const double moved = static_cast<double>(numel) * 4 * kinds;

  const auto [raw_write_s, raw_read_s] = raw_direct(dir, bytes, aio.block_size);
  auto start = Clock::now();
  auto store = dscpp::make_nvme_store(o);  // writes every sub-group once
  const double fill_s = seconds_since(start);
  auto sweep = [&](bool modify) {
    const auto t0 = Clock::now();
    for (int i = 0; i < store->sub_groups(); ++i) {
      store->acquire(i);
      store->release(i, modify);
    }
    store->flush();
    return seconds_since(t0);
  };
  const double read_s = sweep(false);
  const double swap_s = sweep(true);

  const double gb = 1e9;
  const double raw_w = bytes / raw_write_s / gb, raw_r = bytes / raw_read_s / gb;
  const double raw_rw = 2.0 * bytes / (raw_write_s + raw_read_s) / gb;
  const double fill = moved / fill_s / gb, read = moved / read_s / gb, swap = 2 * moved / swap_s / gb;
  std::printf("nvme_swap: %.2f GiB of state in sub-groups of %lld elements, %d buffers, block %lld B, depth %d\n",
              gib, static_cast<long long>(sub_group), buffer_count, static_cast<long long>(aio.block_size),
              aio.queue_depth);
  std::printf("raw O_DIRECT (dd-style, 1 thread): write %.3f GB/s, read %.3f GB/s\n", raw_w, raw_r);
  std::printf("swapper write (initial fill):          %.3f GB/s  ratio %.3f\n", fill, fill / raw_w);
  std::printf("swapper read  (sweep, read-ahead):     %.3f GB/s  ratio %.3f\n", read, read / raw_r);
  std::printf("swapper read+write (optimizer sweep):  %.3f GB/s  ratio %.3f (raw write+read %.3f GB/s)\n", swap,
              swap / raw_rw, raw_rw);
  return 0;
}
