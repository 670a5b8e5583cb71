// Builds the ssh / srun / mpirun command lines of a multi-node launch.
#include "dscpp/launcher/remote_commands.h"

#include <algorithm>
#include <stdexcept>

namespace dscpp::launcher {
namespace {

// The rendezvous first, then the exports: a later assignment wins, so a .deepspeed_env MASTER_ADDR deliberately can
// override the launcher's choice (as an explicit export would in DeepSpeed).
std::vector<std::string> assignments(const World& world, const EnvMap& exports) {
  std::vector<std::string> words{"MASTER_ADDR=" + world.master_addr,
                                 "MASTER_PORT=" + std::to_string(world.master_port)};
  for (const auto& [key, value] : exports) words.push_back(key + "=" + value);
  return words;
}

}  // namespace

std::string shell_quote(const std::string& text) {
  const bool safe = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::string("_-+=/.,:@%").find(c) != std::string::npos;
  });
  if (safe) return text;
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string line;
  for (const auto& word : words) line += (line.empty() ? "" : " ") + shell_quote(word);
  return line;
}

std::vector<std::string> ssh_command(const std::string& host, const std::string& cwd, const EnvMap& exports,
                                     const std::vector<std::string>& remote_argv) {
  std::vector<std::string> env_words{"env"};
  for (const auto& [key, value] : exports) env_words.push_back(key + "=" + value);
  std::string remote = "cd " + shell_quote(cwd) + " && ";
  if (env_words.size() > 1) remote += shell_join(env_words) + " ";
  remote += shell_join(remote_argv);
  return {"ssh", "-o", "BatchMode=yes", host, remote};
}

std::vector<std::string> srun_command(const World& world, bool nodelist, const EnvMap& exports,
                                      const std::vector<std::string>& extra_args,
                                      const std::vector<std::string>& program) {
  const size_t per_node = world.nodes.front().slots.size();
  std::string hosts;
  for (const auto& node : world.nodes) {
    if (node.slots.size() != per_node) {
      throw std::invalid_argument("--launcher slurm: every node needs the same number of processes (host '" +
                                  node.host + "' has " + std::to_string(node.slots.size()) + ", host '" +
                                  world.nodes.front().host + "' has " + std::to_string(per_node) + ")");
    }
    hosts += (hosts.empty() ? "" : ",") + node.host;
  }
  std::vector<std::string> argv{"srun", "-n", std::to_string(world.world_size()),
                                "--nodes=" + std::to_string(world.nodes.size()),
                                "--ntasks-per-node=" + std::to_string(per_node)};
  if (nodelist) argv.push_back("--nodelist=" + hosts);
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  argv.push_back("env");
  for (auto& word : assignments(world, exports)) argv.push_back(word);
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

std::vector<std::string> mpirun_command(const World& world, const std::string& hostfile, const EnvMap& exports,
                                        const std::vector<std::string>& extra_args,
                                        const std::vector<std::string>& program) {
  std::vector<std::string> argv{"mpirun", "-n", std::to_string(world.world_size()), "-hostfile", hostfile};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  for (auto& word : assignments(world, exports)) {
    argv.push_back("-x");
    argv.push_back(word);
  }
  argv.insert(argv.end(), program.begin(), program.end());
  return argv;
}

}  // namespace dscpp::launcher
