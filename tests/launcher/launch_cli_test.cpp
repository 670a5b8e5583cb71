// `dscpp launch` end to end with real processes: the env each rank sees, argument passing, failure propagation
// without orphans, per-rank logs, signal forwarding, and a two-"node" run on loopback with --no_ssh.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "../common/subprocess.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using dscpp::testing::read_text;
using dscpp::testing::run_command;

const std::string kDscpp = DSCPP_BINARY_DIR "/dscpp";
// Ranks that must be stopped sleep far longer than any bound below, so a launcher that waited for them fails the
// bound, while a loaded 2-core CI starting a few shells stays far inside it.
const std::string kRankSleep = "300";
constexpr double kGenerous = 60.0;  // seconds

fs::path test_dir(const std::string& name) {
  static const fs::path root = dscpp::testing::temp_dir("launch_cli");
  const fs::path dir = root / name;
  fs::create_directories(dir);
  return dir;
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Process-group ids of the live (not zombie) processes on this machine, from /proc/<pid>/stat.
std::vector<pid_t> live_process_groups() {
  std::vector<pid_t> groups;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string stat = read_text(entry.path() / "stat");  // "pid (comm) state ppid pgrp ..."
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 1));
    char state = 0;
    pid_t ppid = 0, pgrp = 0;
    if (fields >> state >> ppid >> pgrp && state != 'Z') groups.push_back(pgrp);
  }
  return groups;
}

// True when every rank wrote its pid (= its process group, the launcher makes each rank a group leader) into
// `dir`/pid_* and no live process is left in those groups. Signals land asynchronously: allow up to 60 s (the
// check returns as soon as the groups are gone; the bound only keeps a broken teardown from passing).
bool no_process_left(const fs::path& dir, int expected_files) {
  std::vector<pid_t> ranks;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("pid_", 0) == 0) ranks.push_back(std::stoi(read_text(entry.path())));
  }
  if (static_cast<int>(ranks.size()) != expected_files) return false;
  const auto start = Clock::now();
  while (seconds_since(start) < kGenerous) {
    const auto live = live_process_groups();
    const bool any = std::any_of(ranks.begin(), ranks.end(), [&](pid_t group) {
      return std::find(live.begin(), live.end(), group) != live.end();
    });
    if (!any) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A quoted `sh -c` script for `ranks` ranks: each runs `prologue`, records its pid (its process group: the launcher
// makes each rank a group leader) as `dir`/pid_<RANK>, then sleeps kRankSleep; rank 1 first waits for every pid file (so
// the teardown finds all ranks running) and runs `failure`.
std::string wait_for_pid_files(const fs::path& dir, int ranks) {
  return "while [ $(ls " + dir.string() + " | grep -c pid_) -lt " + std::to_string(ranks) + " ]; do sleep 0.02; done";
}

std::string rank_script(const fs::path& dir, int ranks, const std::string& prologue, const std::string& failure) {
  const std::string d = dir.string();
  return "'" + prologue + " echo $$ > " + d + "/tmp_$RANK && mv " + d + "/tmp_$RANK " + d + "/pid_$RANK; " +
         "if [ $RANK = 1 ]; then " + wait_for_pid_files(dir, ranks) + "; " + failure + "; fi; sleep " + kRankSleep + "'";
}

TEST(LaunchCli, EveryRankGetsItsEnv) {
  const auto r = run_command(kDscpp + " launch --num_gpus 3 --master_port 29711 /bin/sh -c "
                                      "'echo $RANK $WORLD_SIZE $LOCAL_RANK $MASTER_PORT $MASTER_ADDR $CROSS_RANK'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sorted_lines(r.out), (std::vector<std::string>{"0 3 0 29711 127.0.0.1 0", "1 3 1 29711 127.0.0.1 0",
                                                           "2 3 2 29711 127.0.0.1 0"}));
}

TEST(LaunchCli, ProgramArgumentsPassUntouched) {
  const auto r = run_command(kDscpp + " launch --num_gpus 2 echo --lr 3 --num_gpus 5 -i x");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sorted_lines(r.out), (std::vector<std::string>{"--lr 3 --num_gpus 5 -i x", "--lr 3 --num_gpus 5 -i x"}));
}

TEST(LaunchCli, FailingRankStopsTheOthersAndSetsTheExitCode) {
  const fs::path dir = test_dir("fail");
  const auto start = Clock::now();
  const auto r = run_command(kDscpp + " launch --num_gpus 3 sh -c " + rank_script(dir, 3, "", "exit 3"));
  EXPECT_EQ(r.code, 3);
  EXPECT_LT(seconds_since(start), kGenerous);  // the ranks were not waited for
  EXPECT_NE(r.err.find("[dscpp launch] rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(") exited with code 3; terminating the other ranks"), std::string::npos) << r.err;
  EXPECT_TRUE(no_process_left(dir, 3));  // the sleeps (grandchildren of the launcher) included
}

TEST(LaunchCli, RankKilledBySignalGives128PlusSignal) {
  const auto r = run_command(kDscpp + " launch --num_gpus 2 sh -c 'if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 30'");
  EXPECT_EQ(r.code, 128 + SIGKILL);
  EXPECT_NE(r.err.find("was killed by signal 9"), std::string::npos) << r.err;
}

TEST(LaunchCli, RanksIgnoringSigtermAreKilledAfterTheGrace) {
  const fs::path dir = test_dir("grace");
  const auto start = Clock::now();
  const auto r = run_command(kDscpp + " launch --num_gpus 2 --grace_seconds 0.5 sh -c " +
                             rank_script(dir, 2, "trap \"\" TERM;", "exit 5"));
  EXPECT_EQ(r.code, 5);
  EXPECT_LT(seconds_since(start), kGenerous);  // the ranks were not waited for
  EXPECT_NE(r.err.find("ignored SIGTERM for 0.5 s; sending SIGKILL"), std::string::npos) << r.err;
  EXPECT_TRUE(no_process_left(dir, 2));
}

TEST(LaunchCli, SigtermToTheLauncherIsForwarded) {
  const fs::path dir = test_dir("forward");
  // Written to a temporary name and renamed: a pid file that exists is complete.
  const std::string d = dir.string();
  const std::string script =
      "echo $$ > " + d + "/tmp_$RANK && mv " + d + "/tmp_$RANK " + d + "/pid_$RANK; sleep " + kRankSleep;
  const auto start = Clock::now();
  const pid_t launcher = ::fork();
  if (launcher == 0) {
    if (::freopen((dir / "err.txt").c_str(), "w", stderr) == nullptr) ::_exit(126);
    // With restarts left: a launcher told to stop must stop, not start the ranks again.
    ::execl(kDscpp.c_str(), "dscpp", "launch", "--num_gpus", "2", "--max_restarts", "3", "sh", "-c", script.c_str(),
            nullptr);
    ::_exit(127);
  }
  // Wait until both ranks are running, then stop the launcher as a scheduler would.
  while ((!fs::exists(dir / "pid_0") || !fs::exists(dir / "pid_1")) && seconds_since(start) < kGenerous) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(launcher, SIGTERM);
  int status = 0;
  ::waitpid(launcher, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
  EXPECT_NE(read_text(dir / "err.txt").find("[dscpp launch] received signal 15 (Terminated); stopping the ranks"),
            std::string::npos);
  EXPECT_EQ(read_text(dir / "err.txt").find("restart"), std::string::npos) << read_text(dir / "err.txt");
  EXPECT_LT(seconds_since(start), kGenerous);  // the ranks were not waited for
  EXPECT_TRUE(no_process_left(dir, 2));
}

// What a remote node's launcher does when the ssh connection that started it goes away: its stdin closes.
TEST(LaunchCli, StdinEofStopsAWatchingLauncher) {
  const fs::path dir = test_dir("stdin");
  const auto start = Clock::now();
  const auto r = run_command("(" + wait_for_pid_files(dir, 2) + ") | " + kDscpp + " launch --watch_stdin --num_gpus 2 sh -c " +
                             rank_script(dir, 2, "", "true"));
  EXPECT_EQ(r.code, 128 + SIGTERM);
  EXPECT_LT(seconds_since(start), kGenerous);  // the ranks were not waited for
  EXPECT_NE(r.err.find("stdin closed (the launcher that started this node is gone); stopping the ranks"),
            std::string::npos) << r.err;
  EXPECT_TRUE(no_process_left(dir, 2));
}

TEST(LaunchCli, EachRankLogGetsItsOwnFile) {
  const fs::path dir = test_dir("logs") / "ranks";
  const auto r = run_command(kDscpp + " launch --num_gpus 2 --enable_each_rank_log " + dir.string() +
                             " sh -c 'echo out $RANK; echo err $RANK >&2'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(read_text(dir / "rank_0.log"), "out 0\nerr 0\n");
  EXPECT_EQ(read_text(dir / "rank_1.log"), "out 1\nerr 1\n");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 2);
}

TEST(LaunchCli, TwoNodesOnLoopbackWithNoSsh) {
  const fs::path hostfile = test_dir("nodes") / "hostfile";
  std::ofstream(hostfile) << "# two \"nodes\" on this machine\nlocalhost slots=4\n127.0.0.1 slots=4\n";
  const std::string node = kDscpp + " launch -H " + hostfile.string() +
                           " --num_nodes 2 --num_gpus 2 --master_port 29712 --no_ssh --node_rank ";
  const std::string program = " sh -c 'echo $RANK $CROSS_RANK $CROSS_SIZE $LOCAL_RANK $WORLD_SIZE $MASTER_ADDR'";
  const auto r = run_command("(" + node + "0" + program + " & " + node + "1" + program + "; wait)");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(sorted_lines(r.out), (std::vector<std::string>{"0 0 2 0 4 127.0.0.1", "1 0 2 1 4 127.0.0.1",
                                                           "2 1 2 0 4 127.0.0.1", "3 1 2 1 4 127.0.0.1"}));
}

TEST(LaunchCli, UsageErrorsAreOneLineAndExit2) {
  const fs::path hostfile = test_dir("errors") / "hostfile";
  std::ofstream(hostfile) << "w0 slots=2\nw0 slots=2\n";
  auto r = run_command(kDscpp + " launch -H " + hostfile.string() + " echo");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: " + hostfile.string() + ":2: host 'w0' is listed twice\n");
  r = run_command(kDscpp + " launch -i nohost echo");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --include: host 'nohost' is not in the hostfile\n");
  r = run_command(kDscpp + " launch --num_gpus 2");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: no program to launch (usage: dscpp launch [flags] PROGRAM [ARGS...])\n");
  r = run_command(kDscpp + " launch dscpp_no_such_program_xyz");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: program 'dscpp_no_such_program_xyz' not found on PATH\n");
  EXPECT_EQ(r.out, "");
  r = run_command(kDscpp + " launch --max_restarts -1 echo");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: --max_restarts -1: must be 0 or more\n");
  std::ofstream(hostfile) << "w0 slots=2\nw1 slots=2\n";
  r = run_command(kDscpp + " launch -H " + hostfile.string() + " --no_ssh --node_rank 1 --max_restarts 2 echo");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("error: --max_restarts restarts every rank of the job"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

// torchrun's --max_restarts: a failure stops every rank and starts the whole job again, each start told its count
// (TORCHELASTIC_RESTART_COUNT); the job ends well once a start succeeds, or with the failure once restarts run out.
TEST(LaunchCli, MaxRestartsStartsEveryRankAgainAfterAFailure) {
  const fs::path dir = test_dir("restarts");
  const std::string log = (dir / "starts").string();
  auto r = run_command(kDscpp + " launch --num_gpus 2 --max_restarts 3 sh -c 'echo $RANK $TORCHELASTIC_RESTART_COUNT "
                       "$TORCHELASTIC_MAX_RESTARTS >> " + log + "; if [ $RANK = 1 ] && "
                       "[ $TORCHELASTIC_RESTART_COUNT -lt 2 ]; then kill -9 $$; fi'");
  EXPECT_EQ(r.code, 0) << r.err;
  // Rank 0 may be stopped before it writes; rank 1 writes first on every start.
  std::vector<std::string> rank1;
  for (const auto& line : sorted_lines(read_text(log))) if (line[0] == '1') rank1.push_back(line);
  EXPECT_EQ(rank1, (std::vector<std::string>{"1 0 3", "1 1 3", "1 2 3"}));
  EXPECT_NE(r.err.find("[dscpp launch] restart 2 of 3: starting every rank again"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restart 3 of 3"), std::string::npos) << r.err;

  r = run_command(kDscpp + " launch --num_gpus 2 --max_restarts 1 sh -c 'exit 4'");
  EXPECT_EQ(r.code, 4);
  EXPECT_NE(r.err.find("[dscpp launch] restart 1 of 1: starting every rank again"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[dscpp launch] giving up: the job failed again after 1 restart (--max_restarts 1)"),
            std::string::npos) << r.err;
}

// The launcher knows the program's model-parallel axes (its --deepspeed_config, its --pipeline_parallel /
// --tensor_parallel flags, which win): a world they do not divide starts nothing; one they do prints the grid.
TEST(LaunchCli, TheProgramsLayoutMustDivideTheWorldAndIsPrintedAsAGrid) {
  const fs::path config = test_dir("layout") / "ds.json";
  std::ofstream(config) << R"({"pipeline": {"stages": 3}, "tensor_parallel": {"autotp_size": 1}})";
  auto r = run_command(kDscpp + " launch --num_gpus 4 echo --deepspeed_config " + config.string());
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "error: the program's layout, pipeline 3 x tensor parallel 1 = 3 ranks per replica (" +
                       config.string() + "'s pipeline.stages 3), does not divide the 4 ranks of this launch: launch "
                       "a multiple of 3 ranks\n");
  EXPECT_EQ(r.out, "");
  r = run_command(kDscpp + " launch --num_gpus 4 echo --deepspeed_config=" + config.string() +
                  " --pipeline_parallel 2 --tensor_parallel=2");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("[dscpp launch] grid: 4 ranks = pipeline 2 x data parallel 1 x tensor parallel 2 (" +
                       config.string() + "'s pipeline.stages 3, --pipeline_parallel 2, --tensor_parallel 2)"),
            std::string::npos)
      << r.err;
}

}  // namespace
