// The rank-0 progress line, and the small formatting helpers it needs.
#include "dscpp/monitor/step_log.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace dscpp {

int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t total_pages = 0, resident_pages = 0;
  if (!(statm >> total_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t open_file_descriptors() {
  std::error_code ec;
  int64_t count = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::end(it);
       it.increment(ec)) {
    ++count;
  }
  return ec ? -1 : count - 1;  // less the descriptor the listing itself holds
}

int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kib) == 1) return kib * 1024;
  }
  return 0;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.2f %s", bytes, units[unit]);
  return buf;
}

std::string format_step_line(int64_t step, double loss, double lr, double loss_scale, double grad_norm,
                             double samples_per_s, int64_t skipped_steps) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "[deepspeed.cpp] step %lld | loss %.4f | lr %.3e | scale %g | grad_norm %.4f | %.1f samples/s | "
                "skipped %lld | rss %s",
                static_cast<long long>(step), loss, lr, loss_scale, grad_norm, samples_per_s,
                static_cast<long long>(skipped_steps), format_bytes(static_cast<double>(resident_bytes())).c_str());
  return buf;
}

}  // namespace dscpp
