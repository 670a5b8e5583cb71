// Resolving the launch world from the resource flags, and the per-process environment (torchrun-compatible).
#include "dscpp/launcher/world.h"

#include <algorithm>
#include <stdexcept>

namespace dscpp::launcher {
namespace {

constexpr const char* kLocalhost = "localhost";

void check_count(int value, const char* flag) {
  if (value == 0 || value < -1) {
    throw std::invalid_argument(std::string(flag) + " " + std::to_string(value) + ": expected a positive count");
  }
}

// Without a hostfile the pool is localhost alone. Its slot count is unknown on a machine without devices, so it is
// made large enough for the slots an --include names: `--include localhost:1` (pick device 1) works as in DeepSpeed.
Resources local_pool(const WorldOptions& options) {
  int slots = std::max(options.num_gpus, 1);
  if (!options.include.empty()) {
    for (const auto& node : parse_node_spec(options.include, "--include")) {
      for (int slot : node.slots) slots = std::max(slots, slot + 1);
    }
  }
  return {{kLocalhost, slot_range(slots)}};
}

}  // namespace

int World::world_size() const { return first_rank(static_cast<int>(nodes.size())); }

int World::first_rank(int node) const {
  int rank = 0;
  for (int i = 0; i < node; ++i) rank += static_cast<int>(nodes[i].slots.size());
  return rank;
}

World resolve_world(const WorldOptions& options) {
  check_count(options.num_nodes, "--num_nodes");
  check_count(options.num_gpus, "--num_gpus");
  if (options.master_port < 1 || options.master_port > 65535) {
    throw std::invalid_argument("--master_port " + std::to_string(options.master_port) + ": expected 1..65535");
  }
  const bool filtered = !options.include.empty() || !options.exclude.empty();
  if (filtered && (options.num_nodes != -1 || options.num_gpus != -1)) {
    throw std::invalid_argument("--num_nodes/--num_gpus cannot be combined with --include/--exclude");
  }
  World world;
  world.master_port = options.master_port;
  if (!options.world_info.empty()) {
    world.nodes = parse_node_spec(options.world_info, "--world_info");
    for (const auto& node : world.nodes) {
      if (node.slots.empty()) throw std::invalid_argument("--world_info: node '" + node.host + "' has no slot");
    }
    world.set_visible_devices = true;
  } else {
    const Resources pool = options.hostfile.empty() ? local_pool(options) : read_hostfile(options.hostfile);
    if (options.hostfile.empty() && options.num_nodes > 1) {
      throw std::invalid_argument("--num_nodes " + std::to_string(options.num_nodes) +
                                  " needs a --hostfile listing that many hosts");
    }
    world.nodes = filter_resources(pool, options.include, options.exclude);
    if (options.num_nodes > static_cast<int>(world.nodes.size())) {
      throw std::invalid_argument("--num_nodes " + std::to_string(options.num_nodes) + ": the hostfile lists only " +
                                  std::to_string(world.nodes.size()) + " hosts");
    }
    if (options.num_nodes > 0) world.nodes.resize(options.num_nodes);
    // As in DeepSpeed, --num_gpus replaces every host's slots with 0..N-1, whatever the hostfile says.
    if (options.num_gpus > 0) {
      for (auto& node : world.nodes) node.slots = slot_range(options.num_gpus);
    }
    world.set_visible_devices = !options.hostfile.empty() || filtered;
  }
  world.master_addr = options.master_addr;
  if (world.master_addr.empty()) {
    world.master_addr = world.nodes.front().host == kLocalhost ? "127.0.0.1" : world.nodes.front().host;
  }
  return world;
}

EnvMap rank_env(const World& world, int node, int local_rank) {
  const HostSlots& host = world.nodes.at(node);
  if (local_rank < 0 || local_rank >= static_cast<int>(host.slots.size())) {
    throw std::out_of_range("rank_env: node " + std::to_string(node) + " has no local rank " +
                            std::to_string(local_rank));
  }
  const std::string local_size = std::to_string(host.slots.size());
  EnvMap env{
      {"MASTER_ADDR", world.master_addr},
      {"MASTER_PORT", std::to_string(world.master_port)},
      {"WORLD_SIZE", std::to_string(world.world_size())},
      {"RANK", std::to_string(world.first_rank(node) + local_rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_SIZE", local_size},
      {"LOCAL_WORLD_SIZE", local_size},
      {"CROSS_RANK", std::to_string(node)},
      {"CROSS_SIZE", std::to_string(world.nodes.size())},
  };
  if (world.set_visible_devices) {
    std::string devices;
    for (int slot : host.slots) devices += (devices.empty() ? "" : ",") + std::to_string(slot);
    env["CUDA_VISIBLE_DEVICES"] = devices;
  }
  return env;
}

bool is_loopback_host(const std::string& host) {
  return host == kLocalhost || host == "::1" || host.compare(0, 4, "127.") == 0;
}

}  // namespace dscpp::launcher
