// Exports to remote nodes (NCCL_*, UCX_*, .deepspeed_env) and the exact ssh / srun / mpirun command lines.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "dscpp/launcher/remote_commands.h"
#include "dscpp/launcher/remote_env.h"
#include "../common/subprocess.h"

namespace dscpp::launcher {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  static const fs::path root = dscpp::testing::temp_dir("launcher_remote");
  const fs::path dir = root / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

World two_by_two() {
  World world;
  world.nodes = {{"w0", {0, 1}}, {"w1", {0, 1}}};
  world.master_addr = "w0";
  world.master_port = 29600;
  return world;
}

TEST(RemoteEnv, ParsesEnvFile) {
  EXPECT_EQ(parse_env_file("A=1\n# comment\n\n  B = x=y \nC=\n", "f"), (EnvMap{{"A", "1"}, {"B", "x=y"}, {"C", ""}}));
  try {
    parse_env_file("A=1\njunk\n", "f");
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "f:2: expected KEY=VALUE, got 'junk'");
  }
}

TEST(RemoteEnv, NcclUcxThenHomeThenCwd) {
  const fs::path home = fresh_dir("home"), cwd = fresh_dir("cwd");
  std::ofstream(home / ".deepspeed_env") << "A=home\nB=home\n";
  std::ofstream(cwd / ".deepspeed_env") << "B=cwd\nNCCL_DEBUG=WARN\n";
  const EnvMap env{{"NCCL_DEBUG", "INFO"}, {"NCCL_IB_HCA", "mlx5"}, {"UCX_TLS", "tcp"}, {"NCCLX", "no"},
                   {"PATH", "/usr/bin"}, {"HOME", home.string()}};
  EXPECT_EQ(remote_exports(env, cwd.string()), (EnvMap{{"NCCL_DEBUG", "WARN"}, {"NCCL_IB_HCA", "mlx5"},
                                                       {"UCX_TLS", "tcp"}, {"A", "home"}, {"B", "cwd"}}));
}

TEST(RemoteEnv, DsEnvFileOverridesTheName) {
  const fs::path cwd = fresh_dir("cwd2");
  std::ofstream(cwd / ".deepspeed_env") << "IGNORED=1\n";
  std::ofstream(cwd / "job.env") << "JOB=relative\n";
  std::ofstream(cwd / "abs.env") << "JOB=absolute\n";
  EXPECT_EQ(remote_exports({{"DS_ENV_FILE", "job.env"}}, cwd.string()), (EnvMap{{"JOB", "relative"}}));
  EXPECT_EQ(remote_exports({{"DS_ENV_FILE", (cwd / "abs.env").string()}}, "/nonexistent"),
            (EnvMap{{"JOB", "absolute"}}));
  EXPECT_EQ(remote_exports({}, "/nonexistent"), EnvMap{});
}

TEST(RemoteCommands, ShellQuote) {
  EXPECT_EQ(shell_quote("abc-1.2/x=y"), "abc-1.2/x=y");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
  EXPECT_EQ(shell_join({"echo", "a b", "c"}), "echo 'a b' c");
}

TEST(RemoteCommands, Ssh) {
  const auto argv = ssh_command("w1", "/work/my dir", {{"NCCL_DEBUG", "INFO"}, {"X", "a b"}},
                                {"/opt/dscpp", "launch", "--no_ssh", "--node_rank", "1", "train", "--lr", "3"});
  EXPECT_EQ(argv, (std::vector<std::string>{
                      "ssh", "-o", "BatchMode=yes", "w1",
                      "cd '/work/my dir' && env NCCL_DEBUG=INFO 'X=a b' /opt/dscpp launch --no_ssh --node_rank 1 "
                      "train --lr 3"}));
  EXPECT_EQ(ssh_command("w0", "/w", {}, {"p"}).back(), "cd /w && p");
}

// What ssh hands the remote shell, run by a real shell: hostile values in the working directory, the exports and the
// program's arguments arrive as the same bytes, and nothing in them runs.
TEST(RemoteCommands, SshCommandLineSurvivesHostileValuesInARealShell) {
  const std::string dir = (dscpp::testing::temp_dir("launcher_quote") / "dscpp_quote_$(touch pwned)_'x'").string();
  std::filesystem::create_directories(dir);
  const EnvMap exports = {{"X", "$(touch pwned); 'q'"}};
  // The remote side of ssh: its last word, run by /bin/sh.
  const auto remote_output = [&](const std::vector<std::string>& argv) {
    const std::string remote = ssh_command("w1", dir, exports, argv).back();
    FILE* pipe = ::popen(("/bin/sh -c " + shell_quote(remote)).c_str(), "r");
    std::string out;
    if (pipe == nullptr) return out;
    char buffer[256];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
    EXPECT_EQ(::pclose(pipe), 0) << remote;
    return out;
  };
  const std::vector<std::string> hostile = {"$(touch pwned)", "`touch pwned`", "a'b\"c", "x; touch pwned", "$HOME",
                                            "-n", "line\nbreak", "*"};
  std::vector<std::string> argv{"printf", "[%s]"};
  argv.insert(argv.end(), hostile.begin(), hostile.end());
  std::string want;
  for (const auto& word : hostile) want += "[" + word + "]";
  EXPECT_EQ(remote_output(argv), want);
  EXPECT_EQ(remote_output({"printenv", "X"}), "$(touch pwned); 'q'\n");
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir) / "pwned"));
  EXPECT_FALSE(std::filesystem::exists("pwned"));
}

TEST(RemoteCommands, Srun) {
  EXPECT_EQ(srun_command(two_by_two(), true, {{"NCCL_DEBUG", "INFO"}}, {"--partition=gpu"}, {"train", "--lr", "3"}),
            (std::vector<std::string>{"srun", "-n", "4", "--nodes=2", "--ntasks-per-node=2", "--nodelist=w0,w1",
                                      "--partition=gpu", "env", "MASTER_ADDR=w0", "MASTER_PORT=29600",
                                      "NCCL_DEBUG=INFO", "train", "--lr", "3"}));
  EXPECT_EQ(srun_command(two_by_two(), false, {}, {}, {"t"}),
            (std::vector<std::string>{"srun", "-n", "4", "--nodes=2", "--ntasks-per-node=2", "env",
                                      "MASTER_ADDR=w0", "MASTER_PORT=29600", "t"}));
  World uneven = two_by_two();
  uneven.nodes[1].slots = {0};
  try {
    srun_command(uneven, true, {}, {}, {"t"});
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "--launcher slurm: every node needs the same number of processes (host 'w1' "
                                     "has 1, host 'w0' has 2)");
  }
}

TEST(RemoteCommands, Mpirun) {
  EXPECT_EQ(mpirun_command(two_by_two(), "/etc/hosts.txt", {{"UCX_TLS", "tcp"}}, {"--bind-to", "none"}, {"train"}),
            (std::vector<std::string>{"mpirun", "-n", "4", "-hostfile", "/etc/hosts.txt", "--bind-to", "none", "-x",
                                      "MASTER_ADDR=w0", "-x", "MASTER_PORT=29600", "-x", "UCX_TLS=tcp", "train"}));
}

}  // namespace
}  // namespace dscpp::launcher
