// bench/collectives: bus bandwidth of all_reduce, reduce_scatter and all_gather (fp32, 1 MB .. 256 MB) through our
// Comm, with nccl-tests' definitions, beside a memcpy figure from the same run. `--procs N` spawns N ranks of itself
// on loopback; rank 0 prints the table.
//   algbw = S / t, where S is the collective's full buffer: the tensor (all_reduce), the input (reduce_scatter),
//           the output (all_gather), and t the slowest rank's time per call;
//   busbw = algbw * 2(n-1)/n (all_reduce), algbw * (n-1)/n (reduce_scatter, all_gather).
// Expected time on a 2-core machine with the defaults: ~1 min per process count.
#include <CLI/CLI.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>

#include "dscpp/comm/comm.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Calls per size: enough to pass ~1 GB through each collective, at least 3.
int iterations(int64_t bytes) { return static_cast<int>(std::max<int64_t>(3, std::min<int64_t>(50, (1LL << 30) / bytes))); }

// Seconds per call of `run` on the slowest rank, after one warm-up call.
double time_collective(dscpp::Comm& comm, int iters, const std::function<dscpp::Handle()>& run) {
  run().wait();
  comm.barrier();
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) run().wait();
  auto t = torch::tensor({std::chrono::duration<double>(Clock::now() - start).count() / iters}, torch::kDouble);
  comm.all_reduce(t, dscpp::ReduceOp::kMax).wait();
  return t.item<double>();
}

double memcpy_seconds(int64_t bytes, int iters) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);
  const auto start = Clock::now();
  for (int i = 0; i < iters; ++i) std::memcpy(dst.data(), src.data(), bytes);
  return std::chrono::duration<double>(Clock::now() - start).count() / iters;
}

int worker(int64_t min_mb, int64_t max_mb) {
  auto env = dscpp::DistEnv::from_env();
  auto comm = dscpp::init_comm(env, dscpp::CommBackend::kGloo);
  const int n = comm->world_size(), rank = comm->rank();
  if (rank == 0) {
    std::printf("%d processes, backend %s on %s, fp32, GB/s = 1e9 B/s; busbw per nccl-tests\n", n,
                comm->backend().c_str(), env.master_addr.c_str());
    std::printf("%8s %8s | %17s | %17s | %17s\n", "", "memcpy", "all_reduce", "reduce_scatter", "all_gather");
    std::printf("%8s %8s | %8s %8s | %8s %8s | %8s %8s\n", "size", "GB/s", "algbw", "busbw", "algbw", "busbw",
                "algbw", "busbw");
  }
  const double ring = static_cast<double>(n - 1) / n;
  for (int64_t mb = min_mb; mb <= max_mb; mb *= 2) {
    const int64_t bytes = mb << 20, count = bytes / 4;
    const int iters = iterations(bytes);
    const double copy = memcpy_seconds(bytes, iters);  // every rank copies at once, as the collectives run
    auto tensor = torch::ones({count});
    const double ar = time_collective(*comm, iters, [&] { return comm->all_reduce(tensor); });
    auto rs_in = torch::ones({count / n * n});
    auto rs_out = torch::empty({count / n});
    const double rs = time_collective(*comm, iters, [&] { return comm->reduce_scatter(rs_out, rs_in); });
    auto ag_in = torch::ones({count / n});
    auto ag_out = torch::empty({count / n * n});
    const double ag = time_collective(*comm, iters, [&] { return comm->all_gather(ag_out, ag_in); });
    if (rank == 0) {
      const double gb = static_cast<double>(bytes) / 1e9;
      std::printf("%6ld MB %8.2f | %8.2f %8.2f | %8.2f %8.2f | %8.2f %8.2f\n", static_cast<long>(mb), gb / copy,
                  gb / ar, gb / ar * 2 * ring, gb / rs, gb / rs * ring, gb / ag, gb / ag * ring);
      std::fflush(stdout);
    }
  }
  return 0;
}

// Runs `procs` copies of this binary as ranks 0..procs-1 on loopback; returns the first non-zero exit code.
int spawn(int procs, const std::vector<std::string>& args) {
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < procs; ++r) {
    std::vector<std::string> env;
    for (char** p = environ; *p; ++p) env.emplace_back(*p);
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(procs));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back("OMP_NUM_THREADS=1");
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::vector<char*> argv{const_cast<char*>("/proc/self/exe"), const_cast<char*>("--worker")};
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      std::vector<char*> envp;
      for (auto& s : env) envp.push_back(s.data());
      envp.push_back(nullptr);
      ::execve("/proc/self/exe", argv.data(), envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  int result = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    if (code != 0 && result == 0) result = code;
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Bus bandwidth of the comm layer's collectives (fp32) over loopback"};
  int procs = 2;
  int64_t min_mb = 1, max_mb = 256;
  bool is_worker = false;
  app.add_option("--procs", procs, "Number of processes to spawn")->check(CLI::Range(2, 64));
  app.add_option("--min-mb", min_mb, "Smallest size in MB (sizes double)")->check(CLI::Range(1, 1 << 16));
  app.add_option("--max-mb", max_mb, "Largest size in MB")->check(CLI::Range(1, 1 << 16));
  app.add_flag("--worker", is_worker, "Internal: run as one rank (RANK/WORLD_SIZE/MASTER_* from the environment)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (is_worker) return worker(min_mb, max_mb);
    return spawn(procs, {"--min-mb", std::to_string(min_mb), "--max-mb", std::to_string(max_mb)});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_collectives: %s\n", e.what());
    return 1;
  }
}
