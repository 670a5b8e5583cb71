// A one-line progress bar for gpt-train on a terminal; silent when stderr is not a tty (logs, CI).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace gpt {

class ProgressBar {
 public:
  ProgressBar(int64_t total, bool enabled) : total_(total), enabled_(enabled && isatty(fileno(stderr))) {}

  void update(int64_t done, double loss, double tokens_per_s) {
    if (!enabled_) return;
    constexpr int kWidth = 30;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * done / total_) : kWidth;
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r\033[K[%s] %lld/%lld  loss %.4f  %.0f tok/s", bar.c_str(), static_cast<long long>(done),
                 static_cast<long long>(total_), loss, tokens_per_s);
    std::fflush(stderr);
    drawn_ = true;
  }

  // Clears the bar so a log line can be printed on a clean line; the next update redraws it.
  void clear() {
    if (enabled_ && drawn_) std::fprintf(stderr, "\r\033[K");
    drawn_ = false;
  }

  void finish() {
    if (enabled_ && drawn_) std::fprintf(stderr, "\n");
    drawn_ = false;
  }

 private:
  int64_t total_;
  bool enabled_;
  bool drawn_ = false;
};

}  // namespace gpt
