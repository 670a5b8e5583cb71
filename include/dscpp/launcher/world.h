// The world a launch runs: which hosts, how many processes on each, the master address, and the torchrun-compatible
// environment each process gets (RANK, LOCAL_RANK, WORLD_SIZE, CROSS_RANK, ...).
#pragma once

#include <map>
#include <string>

#include "dscpp/launcher/hostfile.h"

namespace dscpp::launcher {

using EnvMap = std::map<std::string, std::string>;

// DeepSpeed's resource flags; -1 / "" mean "not given".
struct WorldOptions {
  std::string hostfile;          // "" = no hostfile: one node, localhost
  std::string include;           // NODE_SPEC[@NODE_SPEC...], NODE_SPEC = NAME[:SLOT[,SLOT...]]
  std::string exclude;           // same syntax; exclusive with include
  int num_nodes = -1;            // first N hosts of the (filtered) hostfile; -1 = all
  int num_gpus = -1;             // processes per node (slots 0..N-1); -1 = the hostfile's slots, 1 without one
  std::string master_addr;       // "" = the first host (127.0.0.1 when it is localhost)
  int master_port = 29500;       // torch.distributed's default
  std::string world_info;        // internal: a resolved world as a node spec, handed to remote launchers
};

struct World {
  Resources nodes;               // node index = position; ranks are numbered node by node
  std::string master_addr;
  int master_port = 29500;
  // Set CUDA_VISIBLE_DEVICES to each node's slots, as DeepSpeed does; only when the slots came from a hostfile or
  // include/exclude, so a plain local run leaves the user's CUDA_VISIBLE_DEVICES alone.
  bool set_visible_devices = false;

  int world_size() const;
  int first_rank(int node) const;  // global rank of the node's local rank 0
};

// Applies DeepSpeed's rules in its order: hostfile → include/exclude → num_nodes → num_gpus. Throws
// std::invalid_argument naming the flag for: num_nodes/num_gpus combined with include/exclude (DeepSpeed forbids
// it), num_nodes above the hosts available, zero or negative counts, a port outside 1..65535.
World resolve_world(const WorldOptions& options);

// The variables the launcher sets for local rank `local_rank` of node `node`: MASTER_ADDR MASTER_PORT WORLD_SIZE
// RANK LOCAL_RANK LOCAL_SIZE LOCAL_WORLD_SIZE CROSS_RANK CROSS_SIZE, and CUDA_VISIBLE_DEVICES when the world asks.
EnvMap rank_env(const World& world, int node, int local_rank);

// localhost, 127.x.x.x and ::1: hosts the default launcher runs without ssh.
bool is_loopback_host(const std::string& host);

}  // namespace dscpp::launcher
