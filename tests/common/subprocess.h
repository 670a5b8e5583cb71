// Test helpers for running the built binaries as real processes: capture exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

namespace dscpp::testing {

struct CommandResult {
  int code = -1;    // exit status; -1 when the process did not exit normally
  std::string out;  // stdout
  std::string err;  // stderr
};

// The directories this test process made, removed when it exits: every test runs in its own process, and a full
// suite once left ~5,000 directories (16 GB of checkpoints and swap files) in /tmp. DSCPP_KEEP_TEST_DIRS=1 keeps them
// for a post-mortem. Only the process that made them removes them — a forked child that exits normally must not.
// A process killed by a timeout leaves its directories; the next run with the same pid starts from an empty one.
class TestDirs {
 public:
  static TestDirs& instance() {
    static TestDirs dirs;
    return dirs;
  }
  void add(const std::filesystem::path& dir) {
    std::lock_guard<std::mutex> lock(mutex_);
    dirs_.push_back(dir);
  }
  ~TestDirs() {
    const char* keep = std::getenv("DSCPP_KEEP_TEST_DIRS");
    if (::getpid() != owner_ || (keep != nullptr && std::string(keep) == "1")) return;
    for (const auto& dir : dirs_) {
      std::error_code ignored;  // a directory already removed by its test is fine
      std::filesystem::remove_all(dir, ignored);
    }
  }

 private:
  TestDirs() = default;
  const pid_t owner_ = ::getpid();
  std::mutex mutex_;
  std::vector<std::filesystem::path> dirs_;
};

// A fresh directory under the system temp dir, unique to this process and `name`, removed when the process exits.
inline std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("dscpp_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  TestDirs::instance().add(dir);
  return dir;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `command` through /bin/sh; stderr goes through a temp file so both streams are kept apart.
inline CommandResult run_command(const std::string& command) {
  static int counter = 0;
  const auto err_file = std::filesystem::temp_directory_path() /
                        ("dscpp_test_stderr_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>" + err_file.string()).c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.out.append(buffer, n);
  const int status = ::pclose(pipe);
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.err = read_text(err_file);
  std::filesystem::remove(err_file);
  return result;
}

}  // namespace dscpp::testing
