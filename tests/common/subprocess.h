// Test helpers for running the built binaries as real processes: capture exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace dscpp::testing {

struct CommandResult {
  int code = -1;    // exit status; -1 when the process did not exit normally
  std::string out;  // stdout
  std::string err;  // stderr
};

// A fresh directory under the system temp dir, unique to this process and `name`.
inline std::filesystem::path temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("dscpp_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
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
