// DistEnv parsing: torchrun-style variables first, then SLURM, then OpenMPI, else one process. Every error names
// the variable, its value and what is allowed, because a wrong rank or port otherwise shows up as a hang.
#include "dscpp/comm/dist_env.h"

#include <unistd.h>  // environ: the process environment, read once by from_env()

#include <cmath>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <vector>

namespace dscpp {
namespace {

using EnvMap = std::map<std::string, std::string>;

std::optional<std::string> get(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

[[noreturn]] void fail(const std::string& name, const std::string& value, const std::string& allowed) {
  throw std::invalid_argument(name + "='" + value + "' is invalid: expected " + allowed);
}

// Strict: the whole value must be a base-10 integer (no "4abc", no "2.0").
int parse_int(const std::string& name, const std::string& value) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(value, &used, 10);
  } catch (const std::exception&) {
    fail(name, value, "an integer");
  }
  if (used != value.size() || v < -(1LL << 31) || v >= (1LL << 31)) fail(name, value, "an integer");
  return static_cast<int>(v);
}

std::optional<int> get_int(const EnvMap& env, const std::string& name) {
  auto v = get(env, name);
  if (!v) return std::nullopt;
  return parse_int(name, *v);
}

int require_int(const EnvMap& env, const std::string& name, const std::string& because) {
  auto v = get_int(env, name);
  if (!v) throw std::invalid_argument(name + " is not set but " + because);
  return *v;
}

std::chrono::milliseconds parse_timeout(const EnvMap& env) {
  auto v = get(env, "DEEPSPEED_TIMEOUT");
  if (!v) return std::chrono::minutes(30);
  size_t used = 0;
  double minutes = 0;
  try {
    minutes = std::stod(*v, &used);
  } catch (const std::exception&) {
    fail("DEEPSPEED_TIMEOUT", *v, "a positive number of minutes, e.g. 30 or 0.5");
  }
  if (used != v->size() || !std::isfinite(minutes) || minutes <= 0 || minutes > 1e7)
    fail("DEEPSPEED_TIMEOUT", *v, "a positive number of minutes, e.g. 30 or 0.5");
  return std::chrono::milliseconds(std::max<long long>(1, std::llround(minutes * 60000.0)));
}

// SLURM_TASKS_PER_NODE: "4(x2),3" means nodes 0 and 1 run 4 tasks, node 2 runs 3.
std::vector<int> parse_tasks_per_node(const std::string& value) {
  const std::string name = "SLURM_TASKS_PER_NODE";
  std::vector<int> counts;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string::npos) end = value.size();
    std::string item = value.substr(start, end - start);
    int repeat = 1;
    if (auto open = item.find("(x"); open != std::string::npos) {
      if (item.back() != ')') fail(name, value, "counts like '4' or '4(x2)', comma-separated");
      repeat = parse_int(name, item.substr(open + 2, item.size() - open - 3));
      item = item.substr(0, open);
    }
    const int count = parse_int(name, item);
    if (count < 1 || repeat < 1) fail(name, value, "positive counts like '4' or '4(x2)'");
    counts.insert(counts.end(), repeat, count);
    start = end + 1;
  }
  return counts;
}

// The first host of SLURM_JOB_NODELIST: "node[03-05,09],gpu1" -> "node03"; "a,b" -> "a".
std::string first_slurm_host(const std::string& list) {
  size_t depth = 0, end = 0;
  for (; end < list.size(); ++end) {
    if (list[end] == '[') ++depth;
    if (list[end] == ']' && depth > 0) --depth;
    if (list[end] == ',' && depth == 0) break;
  }
  const std::string host = list.substr(0, end);
  const auto open = host.find('[');
  if (open == std::string::npos) return host;
  const auto close = host.find(']', open);
  if (close == std::string::npos) fail("SLURM_JOB_NODELIST", list, "a host list like 'node[01-04]'");
  const std::string range = host.substr(open + 1, close - open - 1);
  const std::string first = range.substr(0, range.find_first_of(",-"));
  return host.substr(0, open) + first + host.substr(close + 1);
}

void check_range(const std::string& name, int value, int lo, int hi_exclusive, const std::string& bound) {
  if (value < lo || value >= hi_exclusive)
    fail(name, std::to_string(value),
         "an integer in " + std::to_string(lo) + ".." + std::to_string(hi_exclusive - 1) + " (" + bound + ")");
}

// The variable each field came from in one source, so errors name what the user can fix.
struct VarNames {
  std::string rank, world, local_rank, local_size, cross_rank, cross_size;
};

// Fills the defaults that every source shares and checks the result is one consistent job.
void finish(DistEnv& e, const EnvMap& env, const VarNames& n, std::optional<std::string> master) {
  const std::string& world_var = n.world;
  if (e.world_size < 1) fail(n.world, std::to_string(e.world_size), "an integer >= 1");
  check_range(n.rank, e.rank, 0, e.world_size, n.world + "=" + std::to_string(e.world_size));
  if (e.local_size < 1 || e.local_size > e.world_size)
    fail(n.local_size, std::to_string(e.local_size), "1.." + std::to_string(e.world_size) + " (" + n.world + ")");
  check_range(n.local_rank, e.local_rank, 0, e.local_size, n.local_size + "=" + std::to_string(e.local_size));
  if (e.cross_size < 1) fail(n.cross_size, std::to_string(e.cross_size), "an integer >= 1");
  check_range(n.cross_rank, e.cross_rank, 0, e.cross_size, n.cross_size + "=" + std::to_string(e.cross_size));

  if (!master) master = get(env, "MASTER_ADDR");
  if (!master) {
    if (e.cross_size > 1 || e.local_size < e.world_size)
      throw std::invalid_argument("MASTER_ADDR is not set but the job spans " + std::to_string(e.cross_size) +
                                  " nodes (" + world_var + "=" + std::to_string(e.world_size) + ", local size " +
                                  std::to_string(e.local_size) + "); set it to rank 0's address");
    master = "127.0.0.1";
  }
  e.master_addr = *master;
  if (auto port = get(env, "MASTER_PORT")) {
    e.master_port = parse_int("MASTER_PORT", *port);
    if (e.master_port < 1 || e.master_port > 65535) fail("MASTER_PORT", *port, "a TCP port in 1..65535");
  }
  e.timeout = parse_timeout(env);
  if (auto ifname = get(env, "GLOO_SOCKET_IFNAME")) e.gloo_socket_ifname = *ifname;
}

DistEnv from_torchrun(const EnvMap& env) {
  DistEnv e;
  e.source = "torchrun";
  e.world_size = require_int(env, "WORLD_SIZE", "RANK is set");
  e.rank = require_int(env, "RANK", "WORLD_SIZE is set");
  const char* local_size_var = get(env, "LOCAL_WORLD_SIZE") ? "LOCAL_WORLD_SIZE" : "LOCAL_SIZE";
  e.local_size = get_int(env, local_size_var).value_or(e.world_size);
  e.local_rank = get_int(env, "LOCAL_RANK").value_or(e.local_size == e.world_size ? e.rank : -1);
  if (e.local_rank < 0) throw std::invalid_argument("LOCAL_RANK is not set but the job spans nodes");
  const int nodes = e.local_size > 0 ? (e.world_size + e.local_size - 1) / e.local_size : 1;
  e.cross_size = get_int(env, "CROSS_SIZE").value_or(nodes);
  e.cross_rank = get_int(env, "CROSS_RANK").value_or(e.local_size > 0 ? e.rank / e.local_size : 0);
  finish(e, env, {"RANK", "WORLD_SIZE", "LOCAL_RANK", local_size_var, "CROSS_RANK", "CROSS_SIZE"}, std::nullopt);
  // torch.distributed compares with str(True); anything else means rank 0 hosts the store, as it does there.
  e.agent_store = get(env, "TORCHELASTIC_USE_AGENT_STORE") == std::optional<std::string>("True");
  if (e.agent_store) {
    e.restart_count = require_int(env, "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_USE_AGENT_STORE=True");
    if (e.restart_count < 0) fail("TORCHELASTIC_RESTART_COUNT", std::to_string(e.restart_count), "an integer >= 0");
  }
  return e;
}

DistEnv from_slurm(const EnvMap& env) {
  DistEnv e;
  e.source = "slurm";
  e.rank = require_int(env, "SLURM_PROCID", "this looks like a SLURM task");
  e.world_size = get(env, "SLURM_NTASKS") ? require_int(env, "SLURM_NTASKS", "")
                                          : require_int(env, "SLURM_NPROCS", "SLURM_PROCID is set");
  e.local_rank = get_int(env, "SLURM_LOCALID").value_or(0);
  e.cross_rank = get_int(env, "SLURM_NODEID").value_or(0);
  const char* nodes_var = get(env, "SLURM_NNODES") ? "SLURM_NNODES" : "SLURM_JOB_NUM_NODES";
  e.cross_size = get_int(env, nodes_var).value_or(1);
  if (auto per_node = get_int(env, "SLURM_NTASKS_PER_NODE")) {
    e.local_size = *per_node;
  } else if (auto list = get(env, "SLURM_TASKS_PER_NODE")) {
    const auto counts = parse_tasks_per_node(*list);
    if (e.cross_rank < 0 || e.cross_rank >= static_cast<int>(counts.size()))
      fail("SLURM_NODEID", std::to_string(e.cross_rank),
           "a node index below the " + std::to_string(counts.size()) + " nodes of SLURM_TASKS_PER_NODE='" + *list + "'");
    e.local_size = counts[e.cross_rank];
  } else {
    e.local_size = e.cross_size == 1 ? e.world_size : 1;
  }
  std::optional<std::string> master = get(env, "MASTER_ADDR");
  if (!master && e.cross_size > 1) {
    if (auto nodes = get(env, "SLURM_JOB_NODELIST")) master = first_slurm_host(*nodes);
    else master = get(env, "SLURM_LAUNCH_NODE_IPADDR");
  }
  const char* per_node_var = get(env, "SLURM_NTASKS_PER_NODE") ? "SLURM_NTASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  finish(e, env, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", per_node_var, "SLURM_NODEID", nodes_var}, master);
  return e;
}

DistEnv from_openmpi(const EnvMap& env) {
  DistEnv e;
  e.source = "openmpi";
  e.rank = require_int(env, "OMPI_COMM_WORLD_RANK", "this looks like an OpenMPI process");
  e.world_size = require_int(env, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK is set");
  e.local_size = get_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(e.world_size);
  e.local_rank = get_int(env, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(e.rank);
  if (e.local_size > 0) {
    e.cross_size = (e.world_size + e.local_size - 1) / e.local_size;
    e.cross_rank = e.rank / e.local_size;
  }
  finish(e, env,
         {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
          "node index", "node count"},
         std::nullopt);
  return e;
}

}  // namespace

DistEnv DistEnv::from_map(const std::map<std::string, std::string>& env) {
  if (get(env, "RANK") || get(env, "WORLD_SIZE")) return from_torchrun(env);
  if (get(env, "SLURM_PROCID")) return from_slurm(env);
  if (get(env, "OMPI_COMM_WORLD_RANK") || get(env, "OMPI_COMM_WORLD_SIZE")) return from_openmpi(env);
  DistEnv e;
  e.timeout = parse_timeout(env);
  return e;
}

DistEnv DistEnv::from_env() {
  std::map<std::string, std::string> env;
  for (char** p = environ; p != nullptr && *p != nullptr; ++p) {
    const std::string entry(*p);
    const auto eq = entry.find('=');
    if (eq != std::string::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return from_map(env);
}

}  // namespace dscpp
