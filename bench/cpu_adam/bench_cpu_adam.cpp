// bench/cpu_adam: parameters per second of the CPU Adam (fp32 state + bf16 copy, the offload step), of
// torch::optim::AdamW on the same tensors, and the memory-bandwidth bound: a STREAM-like triad (a = b + s·c)
// measured in the same run, divided by the 28 bytes one Adam element moves (p, m, v read + written, g read,
// bf16 copy written). For each size and thread count: ours, torch, ours / torch, ours / bound.
// The bound follows STREAM's convention (12 counted bytes per triad element), which leaves out the write-allocate
// read of `a` — a quarter of the triad's real traffic — while the Adam update writes back what it just read, so at
// sizes past the caches ours / bound can exceed 100% even though both are limited by the same memory.
// torch's AdamW allocates a parameter-sized temporary per op; past glibc's mmap threshold each is mapped, faulted in
// page by page and unmapped — 26.7 Mparams/s at 64M parameters on our AMD EPYC VM, where a page fault is dear. A user
// who wants the best of torch keeps them in the heap, so the bench re-runs itself with glibc.malloc.mmap_threshold and
// trim_threshold raised (unless GLIBC_TUNABLES already names mmap_threshold): torch then did 582 Mparams/s there.
// Expected time on a 2-core machine with the defaults: ~1 min. Memory: ~1.5 GB at the largest default size.
#include <CLI/CLI.hpp>
#include <omp.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dscpp/optim/cpu_adam.h"

namespace {

double best_seconds(int repeats, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// Triad bandwidth in bytes/s with `threads` threads (12 bytes per element: two reads, one write).
double triad_bandwidth(int64_t n, int threads, int repeats) {
  std::vector<float> va(n), vb(n, 1.0f), vc(n, 2.0f);
  float* __restrict a = va.data();
  const float* __restrict b = vb.data();
  const float* __restrict c = vc.data();
  const double s = best_seconds(repeats, [&] {
#pragma omp parallel for simd schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
  });
  return 12.0 * static_cast<double>(n) / s;
}

}  // namespace

int main(int argc, char** argv) {
  // The strongest torch baseline: its temporaries stay in the heap (see the header). Before anything allocates.
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables == nullptr || std::string(tunables).find("mmap_threshold") == std::string::npos) {
    const std::string raised = "glibc.malloc.mmap_threshold=2147483647:glibc.malloc.trim_threshold=4294967295";
    ::setenv("GLIBC_TUNABLES", (tunables ? std::string(tunables) + ":" : std::string()).append(raised).c_str(), 1);
    ::execv("/proc/self/exe", argv);
    std::perror("bench_cpu_adam: re-running itself with GLIBC_TUNABLES failed");
    return 1;
  }
  CLI::App app{"bench_cpu_adam: CPU Adam params/s vs torch::optim::AdamW and the memory-bandwidth bound"};
  std::vector<int64_t> sizes = {1 << 20, 16 << 20, 64 << 20};
  std::vector<int> threads = {1, 2};
  int repeats = 5;
  app.add_option("--sizes", sizes, "parameter counts");
  app.add_option("--threads", threads, "thread counts");
  app.add_option("--repeats", repeats, "runs of each; the best is used");
  CLI11_PARSE(app, argc, argv);

  const auto path = dscpp::best_simd_path();
  std::printf("bench_cpu_adam: path %s; best of %d; Mparams/s (ours = fused fp32 step + bf16 copy); GLIBC_TUNABLES=%s\n",
              dscpp::to_string(path).c_str(), repeats, std::getenv("GLIBC_TUNABLES"));
  std::printf("%12s %7s %10s %10s %10s %8s %12s\n", "params", "threads", "ours", "torch", "bound", "ours/torch",
              "ours/bound");
  for (int64_t n : sizes) {
    auto p = torch::randn({n}), g = torch::randn({n}) * 1e-2, m = torch::zeros({n}), v = torch::zeros({n});
    auto p16 = torch::empty({n}, torch::kBFloat16);
    for (int t : threads) {
      torch::set_num_threads(t);
      dscpp::AdamStepConfig config;
      config.weight_decay = 0.1;
      int64_t step = 0;
      const double ours = best_seconds(repeats, [&] {
        config.step = ++step;
        dscpp::cpu_adam_step(config, p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(),
                             v.data_ptr<float>(), n, p16.data_ptr(), torch::kBFloat16, path, t);
      });
      auto param = torch::randn({n}).requires_grad_(true);
      param.mutable_grad() = torch::randn({n}) * 1e-2;
      torch::optim::AdamW adamw({param}, torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
      const double theirs = best_seconds(repeats, [&] { adamw.step(); });
      const double bound = triad_bandwidth(n, t, repeats) / 28.0;
      std::printf("%12lld %7d %10.1f %10.1f %10.1f %8.2fx %11.1f%%\n", static_cast<long long>(n), t, n / ours / 1e6,
                  n / theirs / 1e6, bound / 1e6, theirs / ours, 100.0 * (n / ours) / bound);
    }
  }
  return 0;
}
