// `dscpp launch [flags] PROGRAM [ARGS...]`: DeepSpeed's runner flags; reads the process environment, CPU affinity,
// cwd and this binary's path here so the library stays free of process globals.
#include "launch_command.h"

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

extern char** environ;

namespace dscpp {
namespace {

launcher::EnvMap current_environment() {
  launcher::EnvMap env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    const size_t eq = text.find('=');
    if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
  }
  return env;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// `--name VALUE` or `--name=VALUE` among the program's arguments (the last one wins, as CLI parsers take it).
std::optional<std::string> program_flag(const std::vector<std::string>& args, const std::string& name) {
  std::optional<std::string> value;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == name && i + 1 < args.size()) value = args[i + 1];
    if (args[i].rfind(name + "=", 0) == 0) value = args[i].substr(name.size() + 1);
  }
  return value;
}

// The program's pipeline and tensor-parallel sizes: its --deepspeed_config's pipeline.stages and
// tensor_parallel.autotp_size, then its --pipeline_parallel / --tensor_parallel flags (gpt-train's, which fill the
// config's). A config the launcher cannot read is the program's to report; "auto" leaves the size to the program.
void read_program_layout(launcher::LaunchOptions& o) {
  std::vector<std::string> sources;
  if (const auto path = program_flag(o.program, "--deepspeed_config")) {
    std::ifstream in(*path);
    const auto config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    auto size_at = [&](const char* section, const char* key, int& out) {
      if (!config.is_object() || !config.contains(section) || !config[section].is_object()) return;
      const auto& value = (*config.find(section)).value(key, nlohmann::json());
      if (!value.is_number_integer() || value.get<int>() <= 1) return;  // 0 and 1: no slicing (autotp's 0 too)
      out = value.get<int>();
      sources.push_back(*path + "'s " + section + "." + key + " " + std::to_string(out));
    };
    size_at("pipeline", "stages", o.pipeline_parallel);
    size_at("tensor_parallel", "autotp_size", o.tensor_parallel);
  }
  for (const auto& [flag, out] : {std::pair<const char*, int*>{"--pipeline_parallel", &o.pipeline_parallel},
                                  {"--tensor_parallel", &o.tensor_parallel}}) {
    const auto value = program_flag(o.program, flag);
    if (!value) continue;
    try {
      *out = std::stoi(*value);
    } catch (const std::exception&) {
      continue;  // not a number: the program says so
    }
    sources.push_back(std::string(flag) + " " + *value);
  }
  for (const auto& s : sources) o.layout_source += (o.layout_source.empty() ? "" : ", ") + s;
}

}  // namespace

CLI::App* add_launch_command(CLI::App& app, launcher::LaunchOptions& o) {
  CLI::App* cmd = app.add_subcommand("launch", "Start PROGRAM on every rank, like `deepspeed` / torchrun");
  // The first positional is PROGRAM: it and everything after it stay in remaining(), unparsed.
  cmd->prefix_command();
  cmd->add_option("-H,--hostfile", o.world.hostfile, "MPI-style hostfile: `HOST slots=N` lines (default: localhost)");
  cmd->add_option("-i,--include", o.world.include, "Hosts/slots to use: NAME[:SLOT[,SLOT...]][@NAME...]");
  cmd->add_option("-e,--exclude", o.world.exclude, "Hosts/slots not to use (same syntax; exclusive with --include)");
  cmd->add_option("--num_nodes", o.world.num_nodes, "Use the first N hosts of the hostfile");
  cmd->add_option("--num_gpus,--num_accelerators,--num_procs,--nproc_per_node", o.world.num_gpus,
                  "Processes per node (slots 0..N-1); default: the hostfile's slots, or 1");
  cmd->add_option("--master_addr", o.world.master_addr, "Rendezvous address (default: the first host)");
  cmd->add_option("--master_port", o.world.master_port, "Rendezvous port")->capture_default_str();
  cmd->add_option("--launcher", o.launcher, "local|ssh|slurm|openmpi (default: ssh for remote hosts, else local)");
  cmd->add_option("--launcher_args", o.launcher_args, "Extra arguments for srun / mpirun, as one string");
  cmd->add_flag("--no_ssh", o.no_ssh, "Start only this node's ranks (run one launcher per node with --node_rank)");
  cmd->add_option("--node_rank", o.node_rank, "With --no_ssh: this node's index in the hostfile");
  cmd->add_option("--enable_each_rank_log", o.each_rank_log_dir, "Write each rank's stdout+stderr to DIR/rank_R.log");
  cmd->add_flag("--bind_cores_to_rank", o.bind_cores_to_rank, "Pin each local rank to its share of the cores");
  // DeepSpeed's: a PROGRAM ending in .py runs as `python -u SCRIPT --local_rank=N ARGS`; these change that.
  cmd->add_flag("--no_python", o.no_python, "Run a .py PROGRAM itself, not under the Python interpreter");
  cmd->add_flag("--no_local_rank", o.no_local_rank, "Do not pass --local_rank=N to a .py PROGRAM");
  cmd->add_option("--python", o.python, "The interpreter a .py PROGRAM runs under")->capture_default_str();
  cmd->add_option("--max_restarts", o.max_restarts,
                  "After a rank fails, stop every rank and start the job again, up to N times (torchrun's)")
      ->capture_default_str();
  cmd->add_flag("--no_ssh_check", "Accepted for DeepSpeed compatibility; no effect");
  // Internal: how the ssh launcher hands the resolved world to each node's launcher.
  cmd->add_option("--world_info", o.world.world_info)->group("");
  cmd->add_flag("--watch_stdin", o.watch_stdin)->group("");
  cmd->add_option("--grace_seconds", o.grace_seconds)->group("");
  return cmd;
}

int run_launch_command(CLI::App& launch, launcher::LaunchOptions& options, std::ostream& err) {
  try {
    options.program = launch.remaining();
    if (!options.program.empty() && options.program.front().size() > 1 && options.program.front()[0] == '-') {
      throw std::invalid_argument("unknown flag '" + options.program.front() + "' (see dscpp launch --help)");
    }
    std::error_code ec;
    options.self_exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    options.cwd = std::filesystem::current_path().string();
    read_program_layout(options);
    return launcher::run_launch(options, current_environment(), allowed_cpus(), err);
  } catch (const std::exception& e) {
    err << "error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace dscpp
