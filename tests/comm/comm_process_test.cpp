// The comm layer over real processes on loopback: this binary spawns itself with --worker as each rank (see
// comm_worker.cpp) and asserts every rank's exit code, for world sizes 1-4 and for the failure paths.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "../common/sanitizer.h"
#include "../common/subprocess.h"
#include "comm_worker.h"

extern char** environ;

namespace dscpp::testing {
namespace {

namespace fs = std::filesystem;

// A port the kernel says is free now (bind to port 0, read it back, close).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return 0;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

struct Rank {
  pid_t pid = -1;
  int code = -1;  // exit status; -1: killed or not exited
  std::string out, err;
  fs::path out_file, err_file;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Starts ranks `ranks` of a `world`-rank job running `scenario`, waits up to `limit` for all, kills stragglers.
std::vector<Rank> run_job(const std::string& scenario, int world, const std::vector<int>& ranks, double timeout_min,
                          std::chrono::seconds limit) {
  limit *= dscpp::testing::kSanitizerSlowdown;  // a hang guard
  const int port = free_port();
  const fs::path dir = dscpp::testing::temp_dir("comm_" + std::to_string(port));
  std::vector<Rank> out(ranks.size());
  for (size_t k = 0; k < ranks.size(); ++k) {
    const int r = ranks[k];
    out[k].out_file = dir / ("rank" + std::to_string(r) + ".out");
    out[k].err_file = dir / ("rank" + std::to_string(r) + ".err");
    std::vector<std::string> env;
    for (char** p = environ; *p; ++p) {
      const std::string e(*p);
      if (e.rfind("RANK=", 0) && e.rfind("WORLD_SIZE=", 0) && e.rfind("MASTER_", 0) && e.rfind("LOCAL_", 0) &&
          e.rfind("DEEPSPEED_TIMEOUT=", 0) && e.rfind("SLURM_", 0) && e.rfind("OMPI_", 0))
        env.push_back(e);
    }
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back("DEEPSPEED_TIMEOUT=" + std::to_string(timeout_min));
    env.push_back("OMP_NUM_THREADS=1");
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Child: only async-signal-safe calls from here to exec.
      FILE* o = std::fopen(out[k].out_file.c_str(), "w");
      FILE* e = std::fopen(out[k].err_file.c_str(), "w");
      if (o) ::dup2(fileno(o), 1);
      if (e) ::dup2(fileno(e), 2);
      std::vector<char*> argv{const_cast<char*>("/proc/self/exe"), const_cast<char*>("--worker"),
                              const_cast<char*>(scenario.c_str()), nullptr};
      std::vector<char*> envp;
      for (auto& s : env) envp.push_back(s.data());
      envp.push_back(nullptr);
      ::execve("/proc/self/exe", argv.data(), envp.data());
      ::_exit(127);
    }
    out[k].pid = pid;
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  size_t left = ranks.size();
  while (left > 0) {
    for (auto& r : out) {
      if (r.pid < 0) continue;
      int status = 0;
      if (::waitpid(r.pid, &status, WNOHANG) == r.pid) {
        r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        r.pid = -1;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (auto& r : out)
        if (r.pid > 0) {
          ::kill(r.pid, SIGKILL);
          ::waitpid(r.pid, nullptr, 0);
          r.pid = -1;
          r.code = -2;  // still running at the limit: a hang, which every test's exit-code check reports
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& r : out) {
    r.out = slurp(r.out_file);
    r.err = slurp(r.err_file);
  }
  fs::remove_all(dir);
  return out;
}

std::vector<int> all_ranks(int world) {
  std::vector<int> r(world);
  for (int i = 0; i < world; ++i) r[i] = i;
  return r;
}

void expect_all_ok(int world) {
  const auto ranks = run_job("collectives", world, all_ranks(world), 1.0, std::chrono::seconds(100));
  for (size_t r = 0; r < ranks.size(); ++r)
    EXPECT_EQ(ranks[r].code, 0) << "rank " << r << " of " << world << "\nstdout: " << ranks[r].out
                                << "\nstderr: " << ranks[r].err;
}

TEST(CommProcessTest, EveryCollectiveWorld1) { expect_all_ok(1); }
TEST(CommProcessTest, EveryCollectiveWorld2) { expect_all_ok(2); }
TEST(CommProcessTest, EveryCollectiveWorld3) { expect_all_ok(3); }
TEST(CommProcessTest, EveryCollectiveWorld4) { expect_all_ok(4); }

// Rank 1 never starts: rank 0's init_comm fails after DEEPSPEED_TIMEOUT (0.05 min = 3 s), naming the missing rank.
TEST(CommProcessTest, MissingPeerTimesOutNamingIt) {
  const auto start = std::chrono::steady_clock::now();
  const auto ranks = run_job("missing_peer", 2, {0}, 0.05, std::chrono::seconds(30));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(ranks[0].code, 0) << ranks[0].out << ranks[0].err;
  EXPECT_NE(ranks[0].out.find("rank 0/2: rendezvous at 127.0.0.1:"), std::string::npos) << ranks[0].out;
  EXPECT_NE(ranks[0].out.find("timed out after 3 s: 1 of 2 ranks joined; missing rank(s) 1."), std::string::npos)
      << ranks[0].out;
  EXPECT_GE(took, 2.9);  // waited the timeout; a hang would have been killed at the job's limit (code -2)
}

// Rank 0 never starts: rank 1 cannot reach the store and says where it looked.
TEST(CommProcessTest, MissingMasterTimesOut) {
  const auto ranks = run_job("missing_peer", 2, {1}, 0.05, std::chrono::seconds(30));
  ASSERT_EQ(ranks[0].code, 0) << ranks[0].out << ranks[0].err;
  EXPECT_NE(ranks[0].out.find("rank 1/2: could not reach rank 0's rendezvous store at 127.0.0.1:"),
            std::string::npos)
      << ranks[0].out;
}

// Rank 1 dies after start-up; rank 0's next all_reduce raises a CommError naming the collective, not a hang.
TEST(CommProcessTest, DeadPeerFailsTheNextCollective) {
  const auto ranks = run_job("peer_dies", 2, {0, 1}, 0.2, std::chrono::seconds(60));
  EXPECT_EQ(ranks[1].code, 3) << ranks[1].err;
  ASSERT_EQ(ranks[0].code, 0) << ranks[0].out << ranks[0].err;
  EXPECT_NE(ranks[0].out.find("rank 0/2: all_reduce of 1000 x float32 failed: "), std::string::npos)
      << ranks[0].out;
  EXPECT_NE(ranks[0].out.find("A peer rank probably died or is stuck; see its log."), std::string::npos);
}

// Rank 1 is alive but never calls the collective: rank 0's all_reduce times out after DEEPSPEED_TIMEOUT (3 s).
TEST(CommProcessTest, StuckPeerTimesOutTheCollective) {
  const auto ranks = run_job("peer_stuck", 2, {0, 1}, 0.05, std::chrono::seconds(60));
  ASSERT_EQ(ranks[0].code, 0) << ranks[0].out << ranks[0].err;
  EXPECT_EQ(ranks[1].code, 0) << ranks[1].err;
  EXPECT_NE(ranks[0].out.find("rank 0/2: all_reduce of 7 x bfloat16 failed: "), std::string::npos) << ranks[0].out;
}

// After a watcher thread's interrupt(), waiting on a collective the peer has not joined throws the watcher's error
// instead of blocking (without the interrupt the job would hang: rank 1 joins only after rank 0's wait returned).
// A wait already blocked when the interrupt comes is woken by the same condition variable; no test can order the
// two without a sleep, so that path is exercised only when Zero3Divergence finds a rank blocked in a gather.
TEST(CommProcessTest, InterruptMakesAnUnfinishedWaitThrowItsError) {
  const auto ranks = run_job("interrupted", 2, {0, 1}, 1.0, std::chrono::seconds(60));
  ASSERT_EQ(ranks[0].code, 0) << ranks[0].out << ranks[0].err;
  EXPECT_EQ(ranks[1].code, 0) << ranks[1].err;
  EXPECT_NE(ranks[0].out.find("interrupted: the watcher stopped it"), std::string::npos) << ranks[0].out;
}

// Side streams carry each rank's records, in order, between rank 0 and every other rank.
TEST(CommProcessTest, SideStreamCarriesRecordsBetweenRankZeroAndEachRank) {
  const auto ranks = run_job("side_stream", 3, all_ranks(3), 1.0, std::chrono::seconds(60));
  for (size_t r = 0; r < ranks.size(); ++r) ASSERT_EQ(ranks[r].code, 0) << ranks[r].out << ranks[r].err;
  EXPECT_NE(ranks[0].out.find("rank 0 read 6 records"), std::string::npos) << ranks[0].out;
  EXPECT_NE(ranks[2].out.find("rank 2 read 3 records"), std::string::npos) << ranks[2].out;
}

// 8 ranks as pipe 2 × data 2 × model 2, then as pipe 4 × data 2: each rank's groups along each axis.
TEST(CommProcessTest, SplitGivesEachAxisOfARankGridItsOwnGroup) {
  const auto ranks = run_job("topology", 8, all_ranks(8), 1.0, std::chrono::seconds(100));
  for (size_t r = 0; r < ranks.size(); ++r) EXPECT_EQ(ranks[r].code, 0) << "rank " << r << ": " << ranks[r].err;
}

// Point to point over 4 real processes: a ring on the world, then on the pipe groups of a pipe 2 × data 2 grid.
TEST(CommProcessTest, SendAndRecvPairByPeerAndTagInOrder) {
  const auto ranks = run_job("point_to_point", 4, all_ranks(4), 1.0, std::chrono::seconds(60));
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].code, 0) << "rank " << r << ": " << ranks[r].out << ranks[r].err;
    EXPECT_NE(ranks[r].out.find("rank " + std::to_string(r) + " ok"), std::string::npos) << ranks[r].out;
  }
}

}  // namespace
}  // namespace dscpp::testing

int main(int argc, char** argv) {
  if (argc >= 3 && std::strcmp(argv[1], "--worker") == 0) return dscpp::testing::run_worker(argv[2]);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
