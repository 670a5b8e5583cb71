// DistEnv: who this process is in the job, read from the environment the launcher (or torchrun, srun, mpirun) set.
#pragma once

#include <chrono>
#include <map>
#include <string>

namespace dscpp {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;                  // node index
  int cross_size = 1;                  // number of nodes
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;             // 1..65535
  std::chrono::milliseconds timeout{30 * 60 * 1000};  // DEEPSPEED_TIMEOUT (minutes, fractions allowed), default 30
  std::string source = "default";      // "torchrun", "slurm", "openmpi" or "default" (single process)
  std::string gloo_socket_ifname;      // GLOO_SOCKET_IFNAME (comma-separated); empty: chosen from master_addr
  // torchrun's agent already serves the store at MASTER_ADDR:MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True, as its
  // static rendezvous says): every rank connects as a client, and the job's keys live under
  // "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>/", so a job restarted by --max_restarts never reads the failed
  // attempt's keys. The same rules as torch.distributed's.
  bool agent_store = false;
  int restart_count = 0;               // TORCHELASTIC_RESTART_COUNT, read when agent_store

  // Reads, in order of precedence: torchrun-style RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE|LOCAL_SIZE/
  // CROSS_RANK/CROSS_SIZE/MASTER_ADDR/MASTER_PORT; else SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/...; else
  // OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE; else a single process. DEEPSPEED_TIMEOUT in minutes.
  // Defaults: LOCAL_RANK = RANK and LOCAL_SIZE = WORLD_SIZE when unset (one node); CROSS_RANK = rank / local_size,
  // CROSS_SIZE = world_size / local_size; MASTER_PORT 29500; MASTER_ADDR 127.0.0.1 only when every rank is on one
  // node (a multi-node job without a master address is an error, not a hang). SLURM's master is MASTER_ADDR, else
  // the first host of SLURM_JOB_NODELIST (where task 0 runs under the default block distribution), else
  // SLURM_LAUNCH_NODE_IPADDR.
  // Throws std::invalid_argument naming the variable for malformed or inconsistent values.
  static DistEnv from_env();
  // Same, from an explicit map (for tests).
  static DistEnv from_map(const std::map<std::string, std::string>& env);
};

}  // namespace dscpp
