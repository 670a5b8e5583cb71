// `dscpp launch`: from flags to child processes. Local ranks run here; ssh re-runs this binary on every node with
// `--no_ssh --node_rank K` and the resolved world, so each node starts its own ranks; srun/mpirun start all ranks.
#include "dscpp/launcher/launch.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "dscpp/launcher/remote_commands.h"
#include "dscpp/launcher/remote_env.h"

namespace dscpp::launcher {

std::string default_python() {
  // An installed package's `dscpp` command (python/dscpp/_cli.py) names its own interpreter: the wheel may have been
  // built with another.
  const char* installed = std::getenv("DSCPP_PYTHON");
  return installed && *installed ? installed : DSCPP_DEFAULT_PYTHON;
}

namespace {

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

LauncherKind default_kind(const LaunchOptions& options, const World& world) {
  if (options.no_ssh) return LauncherKind::kLocal;
  const bool remote = world.nodes.size() > 1 || !is_loopback_host(world.nodes.front().host);
  return remote ? LauncherKind::kSsh : LauncherKind::kLocal;
}

void check_flags(const LaunchOptions& options, const World& world, LauncherKind kind) {
  const int nodes = static_cast<int>(world.nodes.size());
  if (options.max_restarts < 0) {
    throw std::invalid_argument("--max_restarts " + std::to_string(options.max_restarts) + ": must be 0 or more");
  }
  if (options.max_restarts > 0 && options.no_ssh && nodes > 1) {
    throw std::invalid_argument("--max_restarts restarts every rank of the job, so the launcher that starts every "
                                "node must do it (ssh, slurm, openmpi); with --no_ssh each node's launcher sees only "
                                "its own ranks");
  }
  if (options.node_rank != -1 && !options.no_ssh) {
    throw std::invalid_argument("--node_rank is only meaningful with --no_ssh (each node runs its own launcher)");
  }
  if (options.no_ssh) {
    if (kind != LauncherKind::kLocal) {
      throw std::invalid_argument("--no_ssh starts this node's ranks itself; it cannot be combined with --launcher " +
                                  options.launcher);
    }
    if (options.node_rank < 0 || options.node_rank >= nodes) {
      throw std::invalid_argument("--no_ssh needs --node_rank K with 0 <= K < " + std::to_string(nodes) +
                                  " (the world has " + std::to_string(nodes) + " nodes); got " +
                                  std::to_string(options.node_rank));
    }
  } else if (kind == LauncherKind::kLocal && nodes > 1) {
    throw std::invalid_argument("--launcher local runs one node but the world has " + std::to_string(nodes) +
                                " nodes; use --launcher ssh, or --no_ssh --node_rank K on each node");
  }
  const bool external = kind == LauncherKind::kSlurm || kind == LauncherKind::kOpenMpi;
  if (external && (!options.each_rank_log_dir.empty() || options.bind_cores_to_rank)) {
    throw std::invalid_argument("--enable_each_rank_log and --bind_cores_to_rank work with the local and ssh "
                                "launchers; srun/mpirun have their own (--output, --cpu-bind / --bind-to)");
  }
  if (kind == LauncherKind::kOpenMpi) {
    const WorldOptions& w = options.world;
    if (w.hostfile.empty()) throw std::invalid_argument("--launcher openmpi needs a --hostfile");
    if (!w.include.empty() || !w.exclude.empty() || w.num_nodes != -1 || w.num_gpus != -1) {
      throw std::invalid_argument("--launcher openmpi runs the whole hostfile: --include/--exclude/--num_nodes/"
                                  "--num_gpus are not supported with it (as in DeepSpeed)");
    }
  }
}

bool is_python_script(const LaunchOptions& options) {
  const auto& program = options.program.front();
  return program.size() > 3 && program.compare(program.size() - 3, 3, ".py") == 0;
}

// What a rank runs (see LaunchOptions::no_python); `local_rank` empty where it is not known here (srun, mpirun).
std::vector<std::string> rank_argv(const LaunchOptions& options, std::optional<int> local_rank) {
  if (!is_python_script(options)) return options.program;
  std::vector<std::string> argv;
  if (!options.no_python) argv = {options.python, "-u"};  // -u: each rank's lines appear as they are printed
  argv.push_back(options.program.front());
  if (local_rank && !options.no_local_rank) argv.push_back("--local_rank=" + std::to_string(*local_rank));
  argv.insert(argv.end(), options.program.begin() + 1, options.program.end());
  return argv;
}

std::vector<ChildSpec> local_ranks(const LaunchOptions& options, const World& world, int node, const EnvMap& env,
                                   const std::vector<int>& cpus) {
  const int local_size = static_cast<int>(world.nodes[node].slots.size());
  const auto shares = options.bind_cores_to_rank ? core_shares(cpus, local_size) : std::vector<std::vector<int>>{};
  std::vector<ChildSpec> children;
  for (int local = 0; local < local_size; ++local) {
    ChildSpec child;
    const int rank = world.first_rank(node) + local;
    child.name = "rank " + std::to_string(rank);
    child.argv = rank_argv(options, local);
    child.env = env;
    for (const auto& [key, value] : rank_env(world, node, local)) child.env[key] = value;
    if (!shares.empty()) {
      child.cpus = shares[local];
      child.env["OMP_NUM_THREADS"] = std::to_string(child.cpus.size());
    }
    if (!options.each_rank_log_dir.empty()) {
      child.log_path = (std::filesystem::path(options.each_rank_log_dir) / ("rank_" + std::to_string(rank) + ".log"))
                           .string();
    }
    children.push_back(std::move(child));
  }
  return children;
}

std::vector<ChildSpec> ssh_nodes(const LaunchOptions& options, const World& world, const EnvMap& env) {
  if (options.self_exe.empty()) throw std::invalid_argument("--launcher ssh: the path of this dscpp binary is unknown");
  const EnvMap exports = remote_exports(env, options.cwd);
  std::vector<ChildSpec> children;
  for (size_t node = 0; node < world.nodes.size(); ++node) {
    std::vector<std::string> remote{options.self_exe, "launch", "--no_ssh", "--node_rank", std::to_string(node),
                                    "--world_info", format_node_spec(world.nodes),
                                    "--master_addr", world.master_addr,
                                    "--master_port", std::to_string(world.master_port), "--watch_stdin"};
    if (!options.each_rank_log_dir.empty()) {
      remote.insert(remote.end(), {"--enable_each_rank_log", options.each_rank_log_dir});
    }
    if (options.bind_cores_to_rank) remote.push_back("--bind_cores_to_rank");
    if (options.no_python) remote.push_back("--no_python");
    if (options.no_local_rank) remote.push_back("--no_local_rank");
    remote.insert(remote.end(), options.program.begin(), options.program.end());
    ChildSpec child;
    child.name = "node " + std::to_string(node) + " (" + world.nodes[node].host + ")";
    child.argv = ssh_command(world.nodes[node].host, options.cwd, exports, remote);
    child.env = env;
    child.stdin_pipe = true;  // the remote launcher stops its ranks when this pipe closes
    children.push_back(std::move(child));
  }
  return children;
}

ChildSpec external_child(const std::string& name, std::vector<std::string> argv, const EnvMap& env) {
  ChildSpec child;
  child.name = name;
  child.argv = std::move(argv);
  child.env = env;
  return child;
}

// For a local launch: a missing program is a usage error (exit 2), not a rank failure (exit 127).
void check_program(const std::string& program, const EnvMap& env) {
  if (program.find('/') != std::string::npos) {
    if (::access(program.c_str(), X_OK) != 0) {
      throw std::invalid_argument("program '" + program + "' is not executable");
    }
    return;
  }
  auto path = env.find("PATH");
  std::istringstream dirs(path == env.end() ? std::string("/usr/bin:/bin") : path->second);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const auto candidate = std::filesystem::path(dir.empty() ? "." : dir) / program;
    if (::access(candidate.c_str(), X_OK) == 0) return;
  }
  throw std::invalid_argument("program '" + program + "' not found on PATH");
}

}  // namespace

LauncherKind parse_launcher_kind(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "local") return LauncherKind::kLocal;
  if (lower == "ssh" || lower == "pdsh") return LauncherKind::kSsh;
  if (lower == "slurm") return LauncherKind::kSlurm;
  if (lower == "openmpi") return LauncherKind::kOpenMpi;
  throw std::invalid_argument("--launcher '" + name + "': expected local, ssh, slurm or openmpi");
}

std::vector<std::vector<int>> core_shares(const std::vector<int>& cpus, int ranks) {
  if (ranks <= 0 || static_cast<int>(cpus.size()) < ranks) {
    throw std::invalid_argument("--bind_cores_to_rank: " + std::to_string(ranks) + " local ranks but only " +
                                std::to_string(cpus.size()) + " CPUs available");
  }
  const size_t share = cpus.size() / ranks;
  std::vector<std::vector<int>> shares;
  for (int i = 0; i < ranks; ++i) shares.emplace_back(cpus.begin() + i * share, cpus.begin() + (i + 1) * share);
  return shares;
}

LaunchPlan plan_launch(const LaunchOptions& options, const EnvMap& env, const std::vector<int>& cpus) {
  if (options.program.empty()) {
    throw std::invalid_argument("no program to launch (usage: dscpp launch [flags] PROGRAM [ARGS...])");
  }
  LaunchPlan plan;
  plan.world = resolve_world(options.world);
  // DeepSpeed's grid (PipeModelDataParallelTopology): data parallelism is what the model-parallel axes leave.
  if (const int model = options.pipeline_parallel * options.tensor_parallel; model > 1) {
    const int world = plan.world.world_size();
    const std::string axes = "pipeline " + std::to_string(options.pipeline_parallel) + " x tensor parallel " +
                             std::to_string(options.tensor_parallel);
    if (options.pipeline_parallel < 1 || options.tensor_parallel < 1 || world % model != 0) {
      throw std::invalid_argument("the program's layout, " + axes + " = " + std::to_string(model) + " ranks per "
                                  "replica (" + options.layout_source + "), does not divide the " +
                                  std::to_string(world) + " ranks of this launch: launch a multiple of " +
                                  std::to_string(model) + " ranks");
    }
    plan.grid = "grid: " + std::to_string(world) + " ranks = pipeline " + std::to_string(options.pipeline_parallel) +
                " x data parallel " + std::to_string(world / model) + " x tensor parallel " +
                std::to_string(options.tensor_parallel) + " (" + options.layout_source + ")";
  }
  plan.kind = options.launcher.empty() ? default_kind(options, plan.world) : parse_launcher_kind(options.launcher);
  check_flags(options, plan.world, plan.kind);
  plan.supervisor.grace_seconds = options.grace_seconds;
  plan.supervisor.watch_stdin = options.watch_stdin;
  const std::vector<std::string> extra = split_words(options.launcher_args);
  switch (plan.kind) {
    case LauncherKind::kLocal:
      plan.children = local_ranks(options, plan.world, options.no_ssh ? options.node_rank : 0, env, cpus);
      break;
    case LauncherKind::kSsh:
      plan.children = ssh_nodes(options, plan.world, env);
      plan.supervisor.others = "nodes";
      break;
    case LauncherKind::kSlurm:
      plan.children.push_back(external_child("srun", srun_command(plan.world, !options.world.hostfile.empty(),
                                                                  remote_exports(env, options.cwd), extra,
                                                                  rank_argv(options, std::nullopt)), env));
      break;
    case LauncherKind::kOpenMpi:
      plan.children.push_back(external_child("mpirun", mpirun_command(plan.world, options.world.hostfile,
                                                                      remote_exports(env, options.cwd), extra,
                                                                      rank_argv(options, std::nullopt)), env));
      break;
  }
  return plan;
}

int run_launch(const LaunchOptions& options, const EnvMap& env, const std::vector<int>& cpus, std::ostream& err) {
  for (int restart = 0;; ++restart) {
    // Only a launcher that restarts sets the counters: a node's launcher started by ssh passes on what it was given.
    EnvMap run_env = env;
    if (options.max_restarts > 0) {
      run_env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(restart);
      run_env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(options.max_restarts);
    }
    const LaunchPlan plan = plan_launch(options, run_env, cpus);
    if (restart == 0) {
      if (!plan.grid.empty() && !options.no_ssh) err << "[dscpp launch] " << plan.grid << "\n";
      if (plan.kind == LauncherKind::kLocal) {
        // A script run by the interpreter needs only to exist; the interpreter (or any other program) must run.
        if (is_python_script(options) && !options.no_python) {
          if (::access(options.program.front().c_str(), R_OK) != 0) {
            throw std::invalid_argument("script '" + options.program.front() + "' cannot be read");
          }
          check_program(options.python, env);
        } else {
          check_program(options.program.front(), env);
        }
        if (!options.each_rank_log_dir.empty()) std::filesystem::create_directories(options.each_rank_log_dir);
      } else {
        for (const auto& child : plan.children) {
          err << "[dscpp launch] " << child.name << ": " << shell_join(child.argv) << "\n";
        }
      }
    }
    const SupervisionResult result = supervise(plan.children, plan.supervisor, err);
    if (result.exit_code == 0 || result.stopped || options.max_restarts == 0) return result.exit_code;
    if (restart == options.max_restarts) {
      err << "[dscpp launch] giving up: the job failed again after " << options.max_restarts << " restart"
          << (options.max_restarts == 1 ? "" : "s") << " (--max_restarts " << options.max_restarts << ")"
          << std::endl;
      return result.exit_code;
    }
    err << "[dscpp launch] restart " << restart + 1 << " of " << options.max_restarts << ": starting every "
        << (plan.kind == LauncherKind::kSsh ? "node" : "rank") << " again" << std::endl;
  }
}

}  // namespace dscpp::launcher
