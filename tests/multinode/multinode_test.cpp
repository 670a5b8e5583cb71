// Multi-node jobs on two hosts made of network namespaces (two_hosts.h): each host runs its own `dscpp launch
// --no_ssh --node_rank K` with no GLOO_SOCKET_IFNAME, as a user would start them. The hostname resolves to loopback
// on both hosts, so Gloo must find the veth by the route to the master. Every job's per-step losses equal the same
// world run on one machine.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
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

INSTANTIATE_TEST_SUITE_P(Jobs, MultiNode, ::testing::Values(Job{2, 1}, Job{3, 2}),
                         [](const auto& info) { return name_of(info.param); });

}  // namespace
