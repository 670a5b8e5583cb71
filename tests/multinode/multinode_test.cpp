// Multi-node jobs on two hosts made of network namespaces (two_hosts.h): each host runs its own `dscpp launch
// --no_ssh --node_rank K` with no GLOO_SOCKET_IFNAME, as a user would start them. The hostname resolves to loopback
// on both hosts, so Gloo must find the veth by the route to the master. Every job's per-step losses equal the same
// world run on one machine. Then the ssh launcher, torchrun across the hosts, and failures across hosts (a start-up
// failure, a master address no host has, ranks killed and the link cut mid-step): every launcher ends by itself.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <signal.h>

#include <chrono>
#include <thread>

#include "../common/gpt_train_runs.h"
#include "../common/sanitizer.h"
#include "sshd.h"
#include "two_hosts.h"

namespace {

namespace fs = std::filesystem;
using dscpp::testing::CommandResult;
using dscpp::testing::free_port;
using dscpp::testing::losses_in;
using dscpp::testing::read_text;
using dscpp::testing::run_command;
using dscpp::testing::run_ranks;
using dscpp::testing::temp_dir;
using dscpp::testing::SshHosts;
using dscpp::testing::TwoHosts;

const std::string kDscpp = DSCPP_BINARY_DIR "/dscpp";
const std::string kGptTrain = DSCPP_BINARY_DIR "/gpt-train";

struct Job {
  int stage = 2;
  int per_node = 1;
};

std::string name_of(const Job& job) {
  return "s" + std::to_string(job.stage) + "x" + std::to_string(job.per_node);
}

// gpt-train's arguments: the tiny GPT, six steps, ZeRO `stage`; rank 0 writes its losses to `metrics`.
std::string gpt_train_args(const Job& job, const fs::path& dir, const fs::path& metrics) {
  const nlohmann::json config = {{"train_batch_size", 8},
                                 {"zero_optimization", {{"stage", job.stage}}},
                                 {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  std::ofstream(dir / "ds.json") << config.dump();
  return "--no_progress --model tiny --seq_len 32 --steps 6 --deepspeed_config " + (dir / "ds.json").string() +
         " --metrics " + metrics.string();
}

// Each host's launcher: exit code and what it printed (its ranks' output included).
struct NodeRun {
  int code = -1;
  std::string err;
};

// Starts `commands[h]` on host h, both at once; waits for both. `timeout` is a hang guard.
std::vector<NodeRun> run_on_both(const TwoHosts& hosts, const std::vector<std::string>& commands,
                                 const fs::path& dir) {
  std::string script;
  for (int h = 0; h < 2; ++h) {
    const std::string base = (dir / ("node" + std::to_string(h))).string();
    script += "(" + hosts.on(h, "timeout -s KILL 240 " + commands[h]) + " >" + base + ".out 2>" + base +
              ".err; echo $? >" + base + ".rc) & ";
  }
  run_command("sh -c '" + script + "wait'");
  std::vector<NodeRun> out(2);
  for (int h = 0; h < 2; ++h) {
    const std::string base = (dir / ("node" + std::to_string(h))).string();
    const auto rc = read_text(base + ".rc");
    out[h].code = rc.empty() ? -1 : std::stoi(rc);
    out[h].err = read_text(base + ".out") + read_text(base + ".err");
  }
  return out;
}

void PrintTo(const Job& job, std::ostream* os) { *os << name_of(job); }  // not its bytes (ctest, failures)

class MultiNode : public ::testing::TestWithParam<Job> {
 protected:
  void SetUp() override {
    if (auto why = TwoHosts::unavailable()) GTEST_SKIP() << *why;
  }
};

TEST_P(MultiNode, TwoHostsWithoutGlooSocketIfnameEqualOneMachine) {
  const Job job = GetParam();
  const auto dir = temp_dir("multinode_" + name_of(job));
  const int world = 2 * job.per_node;
  const auto one_machine = dir / "one_machine.jsonl";
  const auto ranks = run_ranks(world, kGptTrain + " " + gpt_train_args(job, dir, one_machine),
                               "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=2");
  for (int r = 0; r < world; ++r) ASSERT_EQ(ranks[r].code, 0) << "rank " << r << ":\n" << ranks[r].err;
  const auto want = losses_in(one_machine);
  ASSERT_EQ(want.size(), 6u);

  TwoHosts hosts;
  const std::string slots = std::to_string(job.per_node);
  std::ofstream(dir / "hostfile") << "node0 slots=" << slots << "\nnode1 slots=" << slots << "\n";
  const auto metrics = dir / "two_hosts.jsonl";
  const int port = free_port();
  std::vector<std::string> commands;
  for (int h = 0; h < 2; ++h) {
    commands.push_back("env -u GLOO_SOCKET_IFNAME OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=2 " + kDscpp + " launch --hostfile " +
                       (dir / "hostfile").string() + " --no_ssh --node_rank " + std::to_string(h) +
                       " --master_addr " + hosts.address(0) + " --master_port " + std::to_string(port) + " " +
                       kGptTrain + " " + gpt_train_args(job, dir, metrics));
  }
  const auto nodes = run_on_both(hosts, commands, dir);
  for (int h = 0; h < 2; ++h) ASSERT_EQ(nodes[h].code, 0) << "node " << h << ":\n" << nodes[h].err;
  EXPECT_EQ(losses_in(metrics), want);
  // Each node says where its traffic goes: the master holds the address, the other host routes to it.
  EXPECT_NE(nodes[0].err.find("Gloo bound to " + hosts.link(0) + " " + hosts.address(0) + " (the interface holds "
                              "MASTER_ADDR"), std::string::npos) << nodes[0].err;
  EXPECT_NE(nodes[1].err.find("Gloo bound to " + hosts.link(1) + " " + hosts.address(1) + " (the route to "
                              "MASTER_ADDR goes through it"), std::string::npos) << nodes[1].err;
}

// The processes left on `host` besides its sshd.
std::vector<std::string> leftovers(const TwoHosts& hosts, int host) {
  std::vector<std::string> out;
  std::istringstream pids(run_command("ip netns pids " + hosts.name(host)).out);
  for (std::string pid; pids >> pid;) {
    std::string comm = read_text("/proc/" + pid + "/comm");
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    if (!comm.empty() && comm != "sshd") out.push_back(pid + " " + comm);
  }
  return out;
}

// Polls `done` until it holds or `limit` passes (a hang guard); true when it held.
template <typename Fn>
bool within(std::chrono::seconds limit, Fn&& done) {
  const auto deadline = std::chrono::steady_clock::now() + limit * dscpp::testing::kSanitizerSlowdown;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

class SshLauncher : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = TwoHosts::unavailable()) GTEST_SKIP() << *why;
    if (auto why = SshHosts::unavailable()) GTEST_SKIP() << *why;
  }
};

// `dscpp launch --hostfile` from node0 with no --no_ssh, as DeepSpeed's users start jobs: the launcher reaches each
// node over ssh (keys and known hosts made by the test), exports .deepspeed_env, and the job equals one machine's.
// Then a long job, its launcher killed mid-step: no process of the job is left on either host.
TEST_F(SshLauncher, ReachesTheOtherHostTrainsAndStopsWhenKilled) {
  const Job job{2, 1};
  const auto dir = temp_dir("multinode_ssh");
  const auto one_machine = dir / "one_machine.jsonl";
  const auto ranks = run_ranks(2, kGptTrain + " " + gpt_train_args(job, dir, one_machine),
                               "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=2");
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].code, 0) << "rank " << r << ":\n" << ranks[r].err;
  const auto want = losses_in(one_machine);

  TwoHosts hosts;
  const SshHosts ssh(hosts, dir);
  std::ofstream(dir / "hostfile") << "node0 slots=1\nnode1 slots=1\n";
  // What reaches the ranks over ssh is .deepspeed_env, not this process's environment: it carries OpenBLAS's kernel
  // choice too (some machines pin OPENBLAS_CORETYPE), without which the one-machine run rounds differently.
  std::ofstream env_file(dir / "ds_env");
  env_file << "OMP_NUM_THREADS=1\nDEEPSPEED_TIMEOUT=2\n";
  for (char** p = environ; *p != nullptr; ++p)
    if (std::string(*p).rfind("OPENBLAS_", 0) == 0) env_file << *p << "\n";
  env_file.close();
  auto launch = [&](const fs::path& metrics, int steps) {
    std::string args = gpt_train_args(job, dir, metrics);
    args.replace(args.find("--steps 6"), 9, "--steps " + std::to_string(steps));
    return "env -i PATH=" + ssh.path() + " DS_ENV_FILE=" + (dir / "ds_env").string() +
           " OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=2 " + kDscpp + " launch --hostfile " + (dir / "hostfile").string() +
           " --master_addr " + hosts.address(0) + " --master_port " + std::to_string(free_port()) + " " + kGptTrain +
           " " + args;
  };
  const auto metrics = dir / "ssh.jsonl";
  const auto trained = run_command("cd " + dir.string() + " && " + hosts.on(0, "timeout -s KILL 240 " +
                                                                                 launch(metrics, 6)));
  ASSERT_EQ(trained.code, 0) << trained.out << trained.err;
  EXPECT_EQ(losses_in(metrics), want);
  EXPECT_EQ(leftovers(hosts, 0), std::vector<std::string>{});
  EXPECT_EQ(leftovers(hosts, 1), std::vector<std::string>{});

  // The long job: started in the background, killed once rank 0 has logged a step.
  const auto long_metrics = dir / "long.jsonl";
  const auto started = run_command("cd " + dir.string() + " && " + hosts.on(0, launch(long_metrics, 100000)) + " >" +
                                   (dir / "long.log").string() + " 2>&1 & echo $!");
  const pid_t launcher = std::stoi(started.out);
  ASSERT_TRUE(within(std::chrono::seconds(120), [&] { return !read_text(long_metrics).empty(); }))
      << read_text(dir / "long.log");
  ASSERT_FALSE(leftovers(hosts, 1).empty()) << "node1's ranks should be running";
  ::kill(launcher, SIGTERM);
  EXPECT_TRUE(within(std::chrono::seconds(60), [&] {
    return leftovers(hosts, 0).empty() && leftovers(hosts, 1).empty();
  })) << "left on node0: " << leftovers(hosts, 0).size() << ", on node1: " << leftovers(hosts, 1).size() << "\n"
      << read_text(dir / "long.log");
}

// Jobs started on both hosts in the background: one launcher per host, as MultiNode's, with no GLOO_SOCKET_IFNAME.
constexpr int kGuardFired = 124;  // timeout's status when the guard ended a hung launcher (a killed rank's is 137)

class TwoHostJob : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = TwoHosts::unavailable()) GTEST_SKIP() << *why;
    dir_ = temp_dir("multinode_failure");
  }

  // Host h's launcher command: `env` before it, the tiny job of `steps` steps, master at `master`.
  std::string launcher(int h, const std::string& env, const std::string& master, int port, int steps) const {
    std::string args = gpt_train_args(Job{2, 1}, dir_, metrics_);
    args.replace(args.find("--steps 6"), 9, "--steps " + std::to_string(steps));
    std::ofstream(dir_ / "hostfile") << "node0 slots=1\nnode1 slots=1\n";
    return "env -u GLOO_SOCKET_IFNAME OMP_NUM_THREADS=1 " + env + " " + kDscpp + " launch --hostfile " +
           (dir_ / "hostfile").string() + " --no_ssh --node_rank " + std::to_string(h) + " --master_addr " + master +
           " --master_port " + std::to_string(port) + " " + kGptTrain + " " + args;
  }

  // Starts `commands[h]` on host h in the background (a 240 s guard around each: status kGuardFired) and returns at
  // once.
  void start(const TwoHosts& hosts, const std::vector<std::string>& commands) {
    std::vector<std::string> on_hosts;
    for (int h = 0; h < 2; ++h) on_hosts.push_back(hosts.on(h, commands[h]));
    start_raw(on_hosts);
  }
  // The same for commands that already say where they run.
  void start_raw(const std::vector<std::string>& commands) {
    started_ = std::chrono::steady_clock::now();
    for (int h = 0; h < 2; ++h) {
      const std::string base = (dir_ / ("node" + std::to_string(h))).string();
      run_command("sh -c '(timeout -k 5 240 " + commands[h] + " >" + base + ".out 2>" + base + ".err; echo $? >" +
                  base + ".rc.tmp; mv " + base + ".rc.tmp " + base + ".rc) >/dev/null 2>&1 &'");
    }
  }

  // Waits for both launchers (the guard bounds it); their exit codes and output, and the seconds each took.
  std::vector<NodeRun> finish(std::vector<double>* seconds = nullptr) const {
    std::vector<NodeRun> out(2);
    std::vector<double> took(2, -1);
    within(std::chrono::seconds(300), [&] {
      for (int h = 0; h < 2; ++h) {
        if (took[h] < 0 && !read_text(dir_ / ("node" + std::to_string(h) + ".rc")).empty())
          took[h] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
      }
      return took[0] >= 0 && took[1] >= 0;
    });
    for (int h = 0; h < 2; ++h) {
      const std::string base = (dir_ / ("node" + std::to_string(h))).string();
      const auto rc = read_text(base + ".rc");
      out[h].code = rc.empty() ? -1 : std::stoi(rc);
      out[h].err = read_text(base + ".out") + read_text(base + ".err");
    }
    if (seconds != nullptr) *seconds = took;
    return out;
  }

  // Kills host h's gpt-train processes, as a machine that lost power would (its launcher is left to notice).
  static void kill_ranks(const TwoHosts& hosts, int h) {
    std::istringstream pids(run_command("ip netns pids " + hosts.name(h)).out);
    for (std::string pid; pids >> pid;) {
      std::string comm = read_text("/proc/" + pid + "/comm");
      if (comm.rfind("gpt-train", 0) == 0) ::kill(std::stoi(pid), SIGKILL);
    }
  }

  fs::path dir_;
  fs::path metrics_ = fs::path("/nonexistent");  // set by tests that watch for the first step
  std::chrono::steady_clock::time_point started_;
};

// Failures across hosts (issue 33, item 4): every launcher must end by itself — not by the test's guard — and say
// what was lost.
class MultiNodeFailure : public TwoHostJob {};



// A rank that fails during start-up on one host — here its GLOO_SOCKET_IFNAME names no interface — while the other
// host's rank is already connecting its Gloo group, which blocks until the comm timeout (30 minutes here). Only the
// start-up watch can end it soon: both launchers exit non-zero by themselves, and the other host's rank names the
// failed rank and its host. Parameter: the failing host (0 also hosts the store, so its report must outlive it).
class MultiNodeStartUp : public TwoHostJob, public ::testing::WithParamInterface<int> {};

TEST_P(MultiNodeStartUp, AFailureOnOneHostStopsEveryHost) {
  const int failing = GetParam(), other = 1 - failing;
  TwoHosts hosts;
  const int port = free_port();
  std::vector<std::string> commands;
  for (int h = 0; h < 2; ++h) {
    const std::string env = h == failing ? "DEEPSPEED_TIMEOUT=30 GLOO_SOCKET_IFNAME=nosuchnic0" : "DEEPSPEED_TIMEOUT=30";
    commands.push_back(launcher(h, env, hosts.address(0), port, 6));
    // launcher() unsets GLOO_SOCKET_IFNAME first; `env NAME=value` after it sets it again for the failing host.
  }
  start(hosts, commands);
  std::vector<double> took;
  const auto nodes = finish(&took);
  std::cout << "[ measured ] launchers exited after " << took[0] << " s (node0) and " << took[1] << " s (node1)\n";
  for (int h = 0; h < 2; ++h) {
    EXPECT_NE(nodes[h].code, 0) << "node " << h << ":\n" << nodes[h].err;
    EXPECT_NE(nodes[h].code, kGuardFired) << "node " << h << " hung:\n" << nodes[h].err;
  }
  const std::string failed = "rank " + std::to_string(failing) + "/2 on host ";
  EXPECT_NE(nodes[failing].err.find("nosuchnic0"), std::string::npos) << nodes[failing].err;
  EXPECT_NE(nodes[other].err.find("stopping, because " + failed), std::string::npos) << nodes[other].err;
  EXPECT_NE(nodes[other].err.find("failed during start-up"), std::string::npos) << nodes[other].err;
}

INSTANTIATE_TEST_SUITE_P(FailingHost, MultiNodeStartUp, ::testing::Values(0, 1),
                         [](const auto& info) { return "node" + std::to_string(info.param); });

// A master address that no host has: rank 0 says so at once; the other host's rank cannot reach it and says so
// within its (short) timeout.
TEST_F(MultiNodeFailure, AMasterAddressNoHostHasIsNamed) {
  TwoHosts hosts;
  const int port = free_port();
  const std::string nowhere = "10.231.0.9";
  start(hosts, {launcher(0, "DEEPSPEED_TIMEOUT=0.1", nowhere, port, 6),
                launcher(1, "DEEPSPEED_TIMEOUT=0.1", nowhere, port, 6)});
  const auto nodes = finish();
  for (int h = 0; h < 2; ++h) {
    EXPECT_NE(nodes[h].code, 0) << "node " << h << ":\n" << nodes[h].err;
    EXPECT_NE(nodes[h].code, kGuardFired) << "node " << h << " hung:\n" << nodes[h].err;
  }
  EXPECT_NE(nodes[0].err.find("MASTER_ADDR='" + nowhere + "' is not an address of this host"), std::string::npos)
      << nodes[0].err;
  EXPECT_NE(nodes[1].err.find("could not reach rank 0's rendezvous store at " + nowhere + ":" + std::to_string(port)),
            std::string::npos)
      << nodes[1].err;
}

// Mid-step failures: the job runs until rank 0 has logged a step, then node1's ranks die (kill -9), or the link
// between the hosts goes down. With a 30-second comm timeout both launchers must exit non-zero within it plus the
// launcher's own grace; node0's names the host it lost.
class MultiNodeMidStep : public TwoHostJob, public ::testing::WithParamInterface<std::string> {};

TEST_P(MultiNodeMidStep, BothLaunchersExitNamingTheLostHost) {
  TwoHosts hosts;
  metrics_ = dir_ / "long.jsonl";
  const int port = free_port();
  start(hosts, {launcher(0, "DEEPSPEED_TIMEOUT=0.5", hosts.address(0), port, 100000),
                launcher(1, "DEEPSPEED_TIMEOUT=0.5", hosts.address(0), port, 100000)});
  ASSERT_TRUE(within(std::chrono::seconds(120), [&] { return !read_text(metrics_).empty(); }))
      << read_text(dir_ / "node0.err");
  const auto cut_at = std::chrono::steady_clock::now();
  if (GetParam() == "killed") kill_ranks(hosts, 1);
  else hosts.cut();
  std::vector<double> took;
  const auto nodes = finish(&took);
  const double since_cut = took[0] - std::chrono::duration<double>(cut_at - started_).count();
  std::cout << "[ measured ] node0's launcher exited " << since_cut << " s after the failure\n";
  for (int h = 0; h < 2; ++h) {
    EXPECT_NE(nodes[h].code, 0) << "node " << h << ":\n" << nodes[h].err;
    EXPECT_NE(nodes[h].code, kGuardFired) << "node " << h << " hung:\n" << nodes[h].err;
  }
  EXPECT_NE(nodes[0].err.find(hosts.address(1)), std::string::npos) << "node0 should name node1:\n" << nodes[0].err;
}

INSTANTIATE_TEST_SUITE_P(Failures, MultiNodeMidStep, ::testing::Values("killed", "link_down"),
                         [](const auto& info) { return info.param; });

// torchrun on each host, meeting at a c10d rendezvous on node0's address (issue 33, item 5). Its agents find out which
// of them hosts the rendezvous, and tell the workers where rank 0 is, by hostname (socket.getfqdn()), so each host
// gets a name of its own (TwoHosts::name_hosts). The job equals the same one on one machine.
using TorchrunTwoHosts = TwoHostJob;

TEST_F(TorchrunTwoHosts, CppRanksOnTwoHostsEqualOneMachine) {
  const auto one_machine = dir_ / "one_machine.jsonl";
  const auto ranks = run_ranks(2, kGptTrain + " " + gpt_train_args(Job{2, 1}, dir_, one_machine),
                               "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=2");
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].code, 0) << "rank " << r << ":\n" << ranks[r].err;
  const auto want = losses_in(one_machine);
  ASSERT_EQ(want.size(), 6u);

  TwoHosts hosts;
  hosts.name_hosts();
  const auto metrics = dir_ / "torchrun.jsonl";
  const std::string endpoint = hosts.address(0) + ":" + std::to_string(free_port());
  std::vector<std::string> commands;
  for (int h = 0; h < 2; ++h) {
    commands.push_back(hosts.on_named(h, "env -u GLOO_SOCKET_IFNAME OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=2 " +
                                         std::string(DSCPP_PYTHON) + " -m torch.distributed.run --nnodes 2 " +
                                         "--nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint " + endpoint +
                                         " --rdzv_id dscpp "
                                         "--no_python " + kGptTrain + " " + gpt_train_args(Job{2, 1}, dir_, metrics)));
  }
  start_raw(commands);
  const auto nodes = finish();
  for (int h = 0; h < 2; ++h) ASSERT_EQ(nodes[h].code, 0) << "node " << h << ":\n" << nodes[h].err;
  EXPECT_EQ(losses_in(metrics), want);
}

INSTANTIATE_TEST_SUITE_P(Jobs, MultiNode, ::testing::Values(Job{2, 1}, Job{3, 2}),
                         [](const auto& info) { return name_of(info.param); });

}  // namespace
