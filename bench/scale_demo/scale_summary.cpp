// bench_scale_summary METRICS.jsonl PARAMS: the scale demonstration's report from gpt-train's metrics — per step the
// time, the part of it spent blocked on NVMe I/O (parameter and optimizer swap files), bytes moved; then whether the
// loss fell (the mean over the first half of the steps against the last half's: one step's batch is noisy), peak RSS, the bytes on
// disk, and the model-state bytes the run trained against the machine's RAM.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: bench_scale_summary METRICS.jsonl PARAMS\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  const double params = std::stod(argv[2]);
  const double gb = 1e9;
  double wait_before = 0, read_before = 0, written_before = 0;
  nlohmann::json last;
  std::vector<double> losses;
  for (std::string line; std::getline(in, line);) {
    const auto m = nlohmann::json::parse(line);
    const auto& p = m["param_swap"];
    const auto& o = m["optimizer_swap"];
    const double wait = p["wait_s"].get<double>() + o["wait_s"].get<double>();
    const double read = p["read_bytes"].get<double>() + o["read_bytes"].get<double>();
    const double written = p["written_bytes"].get<double>() + o["written_bytes"].get<double>();
    const double step_s = m["step_ms"].get<double>() / 1000;
    losses.push_back(m["loss"].get<double>());
    if (last.is_null()) {
      // The counters start when the stores are made, so the first step's include initialize's writes: its split
      // would be wrong, and the steps after it are measured from it.
      std::printf("step %lld: %.1f s (first step: its I/O counters include initialize); loss %.4f\n",
                  m["step"].get<long long>(), step_s, m["loss"].get<double>());
      wait_before = wait;
      read_before = read;
      written_before = written;
      last = m;
      continue;
    }
    std::printf("step %lld: %.1f s = compute %.1f s + I/O wait %.1f s; read %.2f GB, written %.2f GB; loss %.4f\n",
                m["step"].get<long long>(), step_s, step_s - (wait - wait_before), wait - wait_before,
                (read - read_before) / gb, (written - written_before) / gb, m["loss"].get<double>());
    wait_before = wait;
    read_before = read;
    written_before = written;
    last = m;
  }
  if (last.is_null()) {
    std::fprintf(stderr, "%s: no steps\n", argv[1]);
    return 1;
  }
  if (losses.size() >= 3) {
    const size_t half = losses.size() / 2;
    double head = 0, tail = 0;
    for (size_t i = 0; i < half; ++i) head += losses[i] / static_cast<double>(half);
    for (size_t i = losses.size() - half; i < losses.size(); ++i) tail += losses[i] / static_cast<double>(half);
    std::printf("loss: mean %.4f over the first %zu steps, %.4f over the last %zu: %s\n", head, half, tail, half,
                tail < head ? "falls" : "does NOT fall");
  }
  const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const double disk = last["param_swap"]["file_bytes"].get<double>() + last["optimizer_swap"]["file_bytes"].get<double>();
  std::printf("model: %.3f B parameters; model states (bf16 + Adam, 16 B/param) %.1f GB vs RAM %.1f GB\n",
              params / 1e9, 16 * params / gb, ram / gb);
  std::printf("peak RSS %.2f GB; on NVMe %.2f GB (params %.2f GB, optimizer %.2f GB)\n",
              last["peak_rss_bytes"].get<double>() / gb, disk / gb,
              last["param_swap"]["file_bytes"].get<double>() / gb, last["optimizer_swap"]["file_bytes"].get<double>() / gb);
  return 0;
}
