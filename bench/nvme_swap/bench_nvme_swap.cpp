// bench_nvme_swap: the NVMe optimizer store's sustained throughput against the disk's best, and how much of its I/O
// a compute loop hides. The store moves the same bytes as the optimizer step does: the initial fill (write), a sweep
// that only reads, and a sweep that reads each sub-group ahead and writes it back behind.
// Baselines: the disk's best rates as measured by fio (bench/nvme_swap/run.sh runs it with O_DIRECT, the same block
// size and queue depth, several jobs, and passes them in: --fio_write/read/mixed GB/s), and, in the same run, a
// dd-style single thread (sequential O_DIRECT pwrite/pread of aio.block_size pieces, `dd oflag=direct bs=1M`).
// Overlap: a compute loop (1-thread matmuls) sized to the sweep's own time per sub-group runs between acquire and
// release, as the optimizer's update does: hidden = 1 - (overlapped - compute alone) / (swap alone), the share of
// the sweep's I/O time that no longer adds to the step (1: all hidden), and the time acquire/release/flush blocked.
// Expected time on a 2-core machine with the defaults (2 GiB of state): ~1 min.
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// `iterations` 128x128 matmuls: the compute loop the sweep overlaps (main sets LibTorch to 1 thread for it).
void compute(int64_t iterations) {
  static const torch::Tensor a = torch::rand({128, 128}), b = torch::rand({128, 128});
  static torch::Tensor c = torch::empty({128, 128});
  for (int64_t i = 0; i < iterations; ++i) torch::mm_out(c, a, b);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_nvme_swap: the NVMe optimizer store's GB/s against the disk's best, and the I/O it hides"};
  std::string dir = std::filesystem::temp_directory_path().string();
  double gib = 2.0;
  int64_t sub_group = 10'000'000;
  int buffer_count = 4;
  dscpp::AioConfig aio;
  std::string backend = "auto";
  double fio_write = 0, fio_read = 0, fio_mixed = 0;
  app.add_option("--dir", dir, "directory on the disk to measure (nvme_path)");
  app.add_option("--gib", gib, "bytes of optimizer state (master + Adam's two moments), GiB");
  app.add_option("--sub_group_size", sub_group, "elements per sub-group");
  app.add_option("--buffer_count", buffer_count, "offload_optimizer.buffer_count");
  app.add_option("--block_size", aio.block_size, "aio.block_size, bytes");
  app.add_option("--queue_depth", aio.queue_depth, "aio.queue_depth");
  app.add_option("--backend", backend, "auto | io_uring | libaio")->check(CLI::IsMember({"auto", "io_uring", "libaio"}));
  app.add_option("--fio_write", fio_write, "the disk's best sequential write rate from fio, GB/s (0: not measured)");
  app.add_option("--fio_read", fio_read, "the disk's best sequential read rate from fio, GB/s");
  app.add_option("--fio_mixed", fio_mixed, "the disk's best 50/50 read+write rate from fio (both summed), GB/s");
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
  // One sweep in the optimizer's order; `work` runs while sub-group i is held.
  auto sweep = [&](bool modify, int64_t work) {
    const auto t0 = Clock::now();
    for (int i = 0; i < store->sub_groups(); ++i) {
      store->acquire(i);
      compute(work);
      store->release(i, modify);
    }
    store->flush();
    return seconds_since(t0);
  };
  const double read_s = sweep(false, 0);
  const double swap_s = sweep(true, 0);

  // The compute loop, 1 thread (the other cores are free for the I/O), sized so that each sub-group's work takes
  // as long as its share of the swap sweep: perfect overlap would then hide all the I/O.
  torch::set_num_threads(1);
  compute(100);  // warm
  const int64_t probe = 2000;
  const double per_iteration_s = [&] {
    const auto t0 = Clock::now();
    compute(probe);
    return seconds_since(t0) / probe;
  }();
  const int groups = store->sub_groups();
  const auto work = std::max<int64_t>(1, static_cast<int64_t>(swap_s / groups / per_iteration_s));
  const double compute_s = [&] {
    const auto t0 = Clock::now();
    for (int i = 0; i < groups; ++i) compute(work);
    return seconds_since(t0);
  }();
  const double wait_before = store->stats().wait_s;
  const double overlap_s = sweep(true, work);
  const double overlap_wait_s = store->stats().wait_s - wait_before;
  const double hidden = 1.0 - (overlap_s - compute_s) / swap_s;

  const double gb = 1e9;
  const double raw_w = bytes / raw_write_s / gb, raw_r = bytes / raw_read_s / gb;
  const double raw_rw = 2.0 * bytes / (raw_write_s + raw_read_s) / gb;
  const double fill = moved / fill_s / gb, read = moved / read_s / gb, swap = 2 * moved / swap_s / gb;
  auto vs = [](double ours, double base) {
    char text[64];
    if (base > 0) std::snprintf(text, sizeof text, "%.3f", ours / base);
    else std::snprintf(text, sizeof text, "-");
    return std::string(text);
  };
  std::printf("nvme_swap: %.2f GiB of state in %d sub-groups of %lld elements, %d buffers, block %lld B, depth %d\n",
              gib, groups, static_cast<long long>(sub_group), buffer_count, static_cast<long long>(aio.block_size),
              aio.queue_depth);
  std::printf("  fio (the disk's best):          write %.3f GB/s, read %.3f GB/s, 50/50 mixed %.3f GB/s\n", fio_write,
              fio_read, fio_mixed);
  std::printf("  dd-style O_DIRECT, 1 thread:    write %.3f GB/s, read %.3f GB/s\n", raw_w, raw_r);
  std::printf("  %-36s %7s %10s %12s\n", "", "GB/s", "/ fio", "/ dd-style");
  std::printf("  %-36s %7.3f %10s %12s\n", "swapper write (initial fill)", fill, vs(fill, fio_write).c_str(),
              vs(fill, raw_w).c_str());
  std::printf("  %-36s %7.3f %10s %12s\n", "swapper read (sweep, read-ahead)", read, vs(read, fio_read).c_str(),
              vs(read, raw_r).c_str());
  std::printf("  %-36s %7.3f %10s %12s\n", "swapper read+write (optimizer sweep)", swap, vs(swap, fio_mixed).c_str(),
              vs(swap, raw_rw).c_str());
  std::printf("  overlap: swap sweep alone %.3f s, compute alone %.3f s (1 thread), both %.3f s: %.1f%% of the I/O "
              "hidden; blocked on I/O %.3f s\n",
              swap_s, compute_s, overlap_s, 100 * hidden, overlap_wait_s);
  return 0;
}
