// Test helpers for multi-process runs over loopback: a free port, N ranks of one command started together with
// torchrun-style env (each rank's exit code and output collected), and the main() of a binary that is its own ranks.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "subprocess.h"

namespace dscpp::testing {

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel picks it; we release it for the ranks).
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return 29500;
  }
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// Runs `command` as ranks 0..world-1 at once (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT set; `env` is prepended, e.g. "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=2"), waits for all of them.
// `{rank}` in the command is replaced by the rank number.
inline std::vector<CommandResult> run_ranks(int world, const std::string& command, const std::string& env = "") {
  const auto dir = temp_dir("ranks");
  const int port = free_port();
  std::string script;
  for (int r = 0; r < world; ++r) {
    std::string cmd = command;
    for (size_t pos; (pos = cmd.find("{rank}")) != std::string::npos;) cmd.replace(pos, 6, std::to_string(r));
    const auto base = (dir / ("rank" + std::to_string(r))).string();
    script += "(env " + env + " RANK=" + std::to_string(r) + " WORLD_SIZE=" + std::to_string(world) +
              " LOCAL_RANK=" + std::to_string(r) + " LOCAL_WORLD_SIZE=" + std::to_string(world) +
              " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " " + cmd + " >" + base + ".out 2>" +
              base + ".err; echo $? >" + base + ".rc) & ";
  }
  script += "wait";
  run_command("/bin/sh -c '" + script + "'");
  std::vector<CommandResult> results(world);
  for (int r = 0; r < world; ++r) {
    const auto base = dir / ("rank" + std::to_string(r));
    const auto rc = read_text(base.string() + ".rc");
    results[r].code = rc.empty() ? -1 : std::stoi(rc);
    results[r].out = read_text(base.string() + ".out");
    results[r].err = read_text(base.string() + ".err");
  }
  return results;
}

// main() of a test binary that runs its own ranks (run_ranks of /proc/PID/exe): `BINARY --worker SCENARIO` runs
// worker(SCENARIO) and exits with its status (1, the error on stderr, when it throws); anything else runs the tests.
template <typename Worker>
int worker_or_tests(int argc, char** argv, Worker worker) {
  if (argc >= 3 && std::string(argv[1]) == "--worker") {
    try {
      return worker(std::string(argv[2]));
    } catch (const std::exception& e) {
      std::cerr << "worker " << argv[2] << " failed: " << e.what() << std::endl;
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace dscpp::testing
