// Linked into every test binary (tests/CMakeLists.txt): a test process that crashes says where, and what GoogleTest
// had printed before the crash reaches the log. On the lent GPU a test binary died of SIGSEGV (exit 139) with nothing
// after "[ RUN ]": its stdout, redirected to a file, was still in its buffer, and the signal left no trace of where.
// Under the sanitizers their own reports are better, so nothing is installed there.
#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <initializer_list>

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

void write_text(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

// Async-signal-safe: write(2) and backtrace_symbols_fd only (backtrace() was called once at start-up, so it does
// not load libgcc here). Then the default action, so the exit status still says which signal.
void report(int signal) {
  write_text("\n*** test process received ");
  write_text(signal == SIGSEGV ? "SIGSEGV" : signal == SIGBUS ? "SIGBUS" : signal == SIGFPE ? "SIGFPE"
                                         : signal == SIGILL ? "SIGILL" : "SIGABRT");
  write_text("; backtrace (addr2line -e BINARY resolves the binary's own frames):\n");
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

struct InstallCrashReport {
  InstallCrashReport() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // GoogleTest's progress reaches a file line by line
    if (kSanitized) return;
    void* warm[1];
    backtrace(warm, 1);
    for (int signal : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(signal, report);
  }
} install_crash_report;

}  // namespace
