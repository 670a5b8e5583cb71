// plan_launch: which launcher runs, the exact children it would start, and every bad flag combination.
#include <gtest/gtest.h>

#include "expect_error.h"
#include "temp_hostfile.h"
#include "../common/subprocess.h"
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "dscpp/launcher/launch.h"

namespace dscpp::launcher {
namespace {

namespace fs = std::filesystem;

LaunchOptions base() {
  LaunchOptions options;
  options.program = {"train", "--lr", "3"};
  options.self_exe = "/opt/bin/dscpp";
  options.cwd = "/nonexistent/job";  // no .deepspeed_env there
  return options;
}

TEST(LaunchPlan, LocalRanksGetTheLauncherEnvPlusTheirOwn) {
  LaunchOptions options = base();
  options.world.num_gpus = 2;
  options.each_rank_log_dir = "logs";
  const LaunchPlan plan = plan_launch(options, {{"PATH", "/bin"}, {"RANK", "stale"}}, {0, 1, 2, 3});
  EXPECT_EQ(plan.kind, LauncherKind::kLocal);
  ASSERT_EQ(plan.children.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    const ChildSpec& child = plan.children[rank];
    EXPECT_EQ(child.name, "rank " + std::to_string(rank));
    EXPECT_EQ(child.argv, options.program);
    EXPECT_EQ(child.env.at("PATH"), "/bin");
    EXPECT_EQ(child.env.at("RANK"), std::to_string(rank));
    EXPECT_EQ(child.env.at("WORLD_SIZE"), "2");
    EXPECT_EQ(child.env.count("CUDA_VISIBLE_DEVICES"), 0u);  // a plain local run leaves the user's alone
    EXPECT_EQ(child.env.count("OMP_NUM_THREADS"), 0u);
    EXPECT_EQ(child.log_path, "logs/rank_" + std::to_string(rank) + ".log");
    EXPECT_TRUE(child.cpus.empty());
    EXPECT_FALSE(child.stdin_pipe);
  }
}

TEST(LaunchPlan, APythonScriptRunsUnderTheInterpreterWithItsLocalRank) {
  LaunchOptions options = base();
  options.program = {"train.py", "--deepspeed_config", "ds.json"};
  options.world.num_gpus = 2;
  LaunchPlan plan = plan_launch(options, {{"PATH", "/bin"}}, {0, 1});
  ASSERT_EQ(plan.children.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(plan.children[rank].argv,
              (std::vector<std::string>{default_python(), "-u", "train.py", "--local_rank=" + std::to_string(rank),
                                        "--deepspeed_config", "ds.json"}));
  }
  options.no_local_rank = true;
  plan = plan_launch(options, {{"PATH", "/bin"}}, {0, 1});
  EXPECT_EQ(plan.children[1].argv,
            (std::vector<std::string>{default_python(), "-u", "train.py", "--deepspeed_config", "ds.json"}));
  options.no_local_rank = false;
  options.no_python = true;
  plan = plan_launch(options, {{"PATH", "/bin"}}, {0, 1});
  EXPECT_EQ(plan.children[1].argv,
            (std::vector<std::string>{"train.py", "--local_rank=1", "--deepspeed_config", "ds.json"}));
  // A native program (or the interpreter named explicitly) runs untouched: it reads LOCAL_RANK from the environment.
  options = base();
  options.program = {"/usr/bin/python3", "train.py"};
  plan = plan_launch(options, {{"PATH", "/bin"}}, {0});
  EXPECT_EQ(plan.children[0].argv, options.program);
}

TEST(LaunchPlan, SrunAndSshPassThePythonFlagsOn) {
  LaunchOptions options = base();
  options.program = {"train.py"};
  options.launcher = "slurm";
  options.no_python = true;
  options.world.hostfile = write_hostfile("slurm_py", "a slots=1\nb slots=1\n");
  LaunchPlan plan = plan_launch(options, {}, {0});
  ASSERT_EQ(plan.children.size(), 1u);
  EXPECT_EQ(plan.children[0].argv.back(), "train.py");  // no --local_rank: srun's ranks find it in LOCAL_RANK
  options.launcher = "ssh";
  options.no_python = false;
  options.no_local_rank = true;
  plan = plan_launch(options, {}, {0});
  // The remote node's own launcher gets the flag (inside ssh's one remote command line).
  const auto& remote = plan.children[0].argv;
  EXPECT_TRUE(std::any_of(remote.begin(), remote.end(), [](const std::string& word) {
    return word.find("--no_local_rank") != std::string::npos;
  }));
}

TEST(LaunchPlan, BindCoresGivesEvenShares) {
  EXPECT_EQ(core_shares({0, 1, 2, 3, 4}, 2), (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(core_shares({4, 6, 8}, 3), (std::vector<std::vector<int>>{{4}, {6}, {8}}));
  expect_error([] { core_shares({0, 1}, 3); }, "--bind_cores_to_rank: 3 local ranks but only 2 CPUs available");
  LaunchOptions options = base();
  options.world.num_gpus = 2;
  options.bind_cores_to_rank = true;
  const LaunchPlan plan = plan_launch(options, {}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(plan.children[1].cpus, (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(plan.children[1].env.at("OMP_NUM_THREADS"), "3");
}

TEST(LaunchPlan, NoSshStartsOnlyThisNode) {
  LaunchOptions options = base();
  options.world.hostfile = write_hostfile("loop", "localhost slots=2\n127.0.0.1 slots=2\n");
  options.no_ssh = true;
  options.node_rank = 1;
  const LaunchPlan plan = plan_launch(options, {}, {});
  EXPECT_EQ(plan.kind, LauncherKind::kLocal);
  ASSERT_EQ(plan.children.size(), 2u);
  EXPECT_EQ(plan.children[0].name, "rank 2");
  EXPECT_EQ(plan.children[1].env.at("RANK"), "3");
  EXPECT_EQ(plan.children[1].env.at("CROSS_RANK"), "1");
  EXPECT_EQ(plan.children[1].env.at("MASTER_ADDR"), "127.0.0.1");
}

TEST(LaunchPlan, RemoteHostsDefaultToOneSshPerNode) {
  LaunchOptions options = base();
  options.world.hostfile = write_hostfile("remote", "w0 slots=4\nw1 slots=4\nw2 slots=4\n");
  options.world.num_nodes = 2;
  options.world.num_gpus = 2;
  options.each_rank_log_dir = "logs";
  const LaunchPlan plan = plan_launch(options, {{"NCCL_DEBUG", "INFO"}, {"PATH", "/bin"}}, {});
  EXPECT_EQ(plan.kind, LauncherKind::kSsh);
  EXPECT_EQ(plan.supervisor.others, "nodes");
  ASSERT_EQ(plan.children.size(), 2u);
  EXPECT_EQ(plan.children[1].name, "node 1 (w1)");
  EXPECT_TRUE(plan.children[1].stdin_pipe);
  EXPECT_EQ(plan.children[1].argv,
            (std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "w1",
                                      "cd /nonexistent/job && env NCCL_DEBUG=INFO /opt/bin/dscpp launch --no_ssh "
                                      "--node_rank 1 --world_info w0:0,1@w1:0,1 --master_addr w0 --master_port 29500 "
                                      "--watch_stdin --enable_each_rank_log logs train --lr 3"}));
}

TEST(LaunchPlan, SlurmAndOpenMpiAreOneChild) {
  LaunchOptions options = base();
  options.world.hostfile = write_hostfile("pair", "w0 slots=2\nw1 slots=2\n");
  options.launcher = "SLURM";
  options.launcher_args = " --partition=gpu  --time=10 ";
  LaunchPlan plan = plan_launch(options, {}, {});
  ASSERT_EQ(plan.children.size(), 1u);
  EXPECT_EQ(plan.children[0].argv,
            (std::vector<std::string>{"srun", "-n", "4", "--nodes=2", "--ntasks-per-node=2", "--nodelist=w0,w1",
                                      "--partition=gpu", "--time=10", "env", "MASTER_ADDR=w0", "MASTER_PORT=29500",
                                      "train", "--lr", "3"}));
  options.launcher = "openmpi";
  options.launcher_args = "";
  plan = plan_launch(options, {}, {});
  EXPECT_EQ(plan.children[0].argv,
            (std::vector<std::string>{"mpirun", "-n", "4", "-hostfile", options.world.hostfile, "-x",
                                      "MASTER_ADDR=w0", "-x", "MASTER_PORT=29500", "train", "--lr", "3"}));
}

TEST(LaunchPlan, BadCombinationsAreErrors) {
  const std::string pair = write_hostfile("pair2", "w0 slots=2\nw1 slots=2\n");
  expect_error([] {
    LaunchOptions o = base();
    o.program.clear();
    plan_launch(o, {}, {});
  }, "no program to launch (usage: dscpp launch [flags] PROGRAM [ARGS...])");
  expect_error([] {
    LaunchOptions o = base();
    o.node_rank = 0;
    plan_launch(o, {}, {});
  }, "--node_rank is only meaningful with --no_ssh (each node runs its own launcher)");
  expect_error([&] {
    LaunchOptions o = base();
    o.world.hostfile = pair;
    o.no_ssh = true;
    plan_launch(o, {}, {});
  }, "--no_ssh needs --node_rank K with 0 <= K < 2 (the world has 2 nodes); got -1");
  expect_error([&] {
    LaunchOptions o = base();
    o.world.hostfile = pair;
    o.no_ssh = true;
    o.node_rank = 0;
    o.launcher = "slurm";
    plan_launch(o, {}, {});
  }, "--no_ssh starts this node's ranks itself; it cannot be combined with --launcher slurm");
  expect_error([&] {
    LaunchOptions o = base();
    o.world.hostfile = pair;
    o.launcher = "local";
    plan_launch(o, {}, {});
  }, "--launcher local runs one node but the world has 2 nodes; use --launcher ssh, or --no_ssh --node_rank K on "
     "each node");
  expect_error([] {
    LaunchOptions o = base();
    o.launcher = "pbs";
    plan_launch(o, {}, {});
  }, "--launcher 'pbs': expected local, ssh, slurm or openmpi");
  expect_error([] {
    LaunchOptions o = base();
    o.launcher = "openmpi";
    plan_launch(o, {}, {});
  }, "--launcher openmpi needs a --hostfile");
  expect_error([&] {
    LaunchOptions o = base();
    o.world.hostfile = pair;
    o.world.num_gpus = 1;
    o.launcher = "openmpi";
    plan_launch(o, {}, {});
  }, "--launcher openmpi runs the whole hostfile: --include/--exclude/--num_nodes/--num_gpus are not supported "
     "with it (as in DeepSpeed)");
  expect_error([&] {
    LaunchOptions o = base();
    o.launcher = "slurm";
    o.each_rank_log_dir = "logs";
    plan_launch(o, {}, {});
  }, "--enable_each_rank_log and --bind_cores_to_rank work with the local and ssh launchers; srun/mpirun have their "
     "own (--output, --cpu-bind / --bind-to)");
}

}  // namespace
}  // namespace dscpp::launcher
