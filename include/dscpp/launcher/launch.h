// `dscpp launch` as a library: resolve the world, pick the launcher (local / ssh / slurm / openmpi), build the child
// processes — local ranks, one ssh per node, or one srun/mpirun — and supervise them.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "dscpp/launcher/supervisor.h"
#include "dscpp/launcher/world.h"

namespace dscpp::launcher {

enum class LauncherKind { kLocal, kSsh, kSlurm, kOpenMpi };

// "local", "ssh", "slurm", "openmpi" (case-insensitive; DeepSpeed's "pdsh" is taken as ssh). Throws naming the value.
LauncherKind parse_launcher_kind(const std::string& name);

// The interpreter .py programs run under: the environment variable DSCPP_PYTHON where set (an installed package's
// `dscpp` command sets it to its own), else the one this build was made for (CMake's DSCPP_PYTHON, whose torch the
// engine links).
std::string default_python();

struct LaunchOptions {
  WorldOptions world;
  std::string launcher;               // "" = ssh when the world has a non-loopback host or several nodes, else local
  std::string launcher_args;          // extra words for srun/mpirun, split at whitespace
  bool no_ssh = false;                // start only node `node_rank`'s ranks: every node runs its own launcher
  int node_rank = -1;                 // with no_ssh: which node this is (0-based, hostfile order)
  std::string each_rank_log_dir;      // "" = ranks inherit stdout/stderr; else DIR/rank_<R>.log per rank
  bool bind_cores_to_rank = false;    // pin local rank i to the i-th even share of the cores; OMP_NUM_THREADS = share
  bool watch_stdin = false;           // internal (set by the ssh launcher): stdin EOF stops this node's ranks
  double grace_seconds = 5.0;         // SIGTERM → SIGKILL grace when tearing down
  // torchrun's --max_restarts (DeepSpeed's launcher has none): when a rank fails, every rank is stopped and the whole
  // job started again, up to this many times. Ranks see TORCHELASTIC_RESTART_COUNT (0 on the first start) and
  // TORCHELASTIC_MAX_RESTARTS, as under torchrun; a program that saves and loads one directory (gpt-train
  // --save_dir D --load_dir D) continues from its last checkpoint. A launcher told to stop (a signal) never restarts.
  int max_restarts = 0;
  std::vector<std::string> program;   // PROGRAM ARGS...; a PROGRAM ending in .py is run as DeepSpeed runs it (below)
  // A Python script (PROGRAM ending in .py) runs as `python -u SCRIPT --local_rank=N ARGS...`, as DeepSpeed's
  // launcher runs it: no_python runs the script itself instead, no_local_rank leaves --local_rank out. Ranks started
  // by srun / mpirun get no --local_rank (their local rank is only known there; LOCAL_RANK is in the environment).
  // Other programs (gpt-train, python3 itself) run untouched: they read LOCAL_RANK from the environment.
  bool no_python = false;
  bool no_local_rank = false;
  // The interpreter a .py PROGRAM runs under: by default the one this build's torch belongs to (DSCPP_PYTHON), so a
  // script imports the torch the engine links; the `dscpp` console script of an installed package passes its own.
  std::string python = default_python();
  // The program's model-parallel layout (dscpp launch reads it from the program's --deepspeed_config — its
  // pipeline.stages and tensor_parallel.autotp_size — and its --pipeline_parallel / --tensor_parallel flags, as
  // gpt-train takes them): the world must be a multiple of pipeline × tensor parallel, or nothing starts; the
  // launch prints the grid. `layout_source` says where the numbers came from, for the messages.
  int pipeline_parallel = 1;
  int tensor_parallel = 1;
  std::string layout_source;
  std::string self_exe;               // this dscpp binary: what ssh runs on the other nodes
  std::string cwd;                    // the directory ranks start in (remote nodes `cd` to it)
};

// A launch, fully decided but not started: what tests inspect.
struct LaunchPlan {
  World world;
  std::string grid;  // "grid: 8 ranks = pipeline 2 x data parallel 2 x tensor parallel 2" ("" without model parallelism)
  LauncherKind kind = LauncherKind::kLocal;
  std::vector<ChildSpec> children;
  SupervisorOptions supervisor;
};

// Decides everything. `env` is the launcher's environment (inherited by local ranks, source of NCCL_*/UCX_* and
// DS_ENV_FILE/HOME); `cpus` the CPUs this launcher may use (for --bind_cores_to_rank). Throws std::invalid_argument
// for any bad flag combination, naming the flags.
LaunchPlan plan_launch(const LaunchOptions& options, const EnvMap& env, const std::vector<int>& cpus);

// Even shares of `cpus` for `ranks` local ranks: rank i gets cpus[i*s, (i+1)*s), s = cpus.size() / ranks (leftover
// CPUs stay unused so every rank gets the same). Throws when there are fewer CPUs than ranks.
std::vector<std::vector<int>> core_shares(const std::vector<int>& cpus, int ranks);

// plan_launch + create the log directory + supervise, again after a failure while restarts are left. Returns the
// launch's exit code (see SupervisionResult): the last run's.
int run_launch(const LaunchOptions& options, const EnvMap& env, const std::vector<int>& cpus, std::ostream& err);

}  // namespace dscpp::launcher
