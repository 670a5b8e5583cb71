// init_comm: rendezvous, then a Gloo (CPU) or NCCL (GPU) process group wrapped as a Comm. The Gloo device is chosen
// so that a loopback master keeps all traffic on loopback; otherwise GLOO_SOCKET_IFNAME picks the NIC, or, unset, the
// interface that reaches the master (gloo_interface.h).
#include <unistd.h>

#include <iostream>
#include <sstream>

#include "dscpp/comm/gloo_interface.h"
#include "process_group_comm.h"
#include "rendezvous.h"
#include "startup_watch.h"

namespace dscpp {
namespace {

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

// Gloo's devices for this rank. `bound` (if given) gets a line for the start-up log naming what was bound and why,
// `address` the address bound to (GLOO_SOCKET_IFNAME: the interfaces' names).
std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices(const DistEnv& env, std::string* bound = nullptr,
                                                                     std::string* address = nullptr) {
  auto say = [&](const std::string& line, const std::string& where) {
    if (bound != nullptr) *bound = line;
    if (address != nullptr) *address = where;
  };
  if (is_loopback(env.master_addr)) {
    say("loopback " + env.master_addr + " (the master is on this host)", env.master_addr);
    return {c10d::ProcessGroupGloo::createDeviceForHostname(env.master_addr)};
  }
  if (!env.gloo_socket_ifname.empty()) {
    std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
    std::stringstream names(env.gloo_socket_ifname);
    for (std::string name; std::getline(names, name, ',');)
      if (!name.empty()) devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
    say(env.gloo_socket_ifname + " (GLOO_SOCKET_IFNAME)", env.gloo_socket_ifname);
    return devices;
  }
  // Gloo's default device binds to what the hostname resolves to, often loopback: choose as NCCL does instead.
  const GlooBinding binding =
      choose_gloo_binding(gather_binding_inputs(env.master_addr, env.master_port, env.cross_size > 1));
  say(binding.interface + " " + binding.address + " (" + binding.reason + "; MASTER_ADDR " + env.master_addr + ")",
      binding.address);
  return {c10d::ProcessGroupGloo::createDeviceForHostname(binding.address)};
}

// The prefix of the keys our side streams write straight to the TCPStore (under no PrefixStore): under torchrun's
// agent store, per attempt, as the rendezvous store's keys are (DistEnv::agent_store).
std::string stream_prefix(const DistEnv& env) {
  return env.agent_store ? "attempt_" + std::to_string(env.restart_count) + "/" : "";
}

// Sub-groups (Comm::split) on the same devices, with the same timeout.
GroupFactory gloo_factory(c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> options) {
  return [options](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  };
}

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("(unknown)");
}

// Gloo's connect error, with the one cause we can name: a peer that advertised loopback to a job across hosts.
std::string connect_failure(const DistEnv& env, const std::string& gloo_error) {
  if (env.cross_size > 1 && gloo_error.find("[127.") != std::string::npos) {
    return gloo_error + ". A rank on another host advertised a loopback address: its Gloo is bound to loopback " +
           "(GLOO_SOCKET_IFNAME=lo, or a hostname resolving to 127.x with Gloo's default device); on that host unset "
           "GLOO_SOCKET_IFNAME (dscpp then binds the interface that reaches MASTER_ADDR) or name the right one";
  }
  return gloo_error + ". A peer rank may have failed during start-up; see its log";
}

// Every node's host, address and ranks, from each node's local rank 0 through the store (cross_size keys, read by
// every rank): what a failed collective's error names (ProcessGroupComm::set_nodes).
std::vector<JobNode> exchange_nodes(c10d::Store& store, const DistEnv& env, const std::string& address) {
  const std::string prefix = "dscpp/node/";
  if (env.local_rank == 0) {
    const int first = env.rank;
    const std::string text = host_name() + "\n" + address + "\n" + std::to_string(first) + "\n" +
                             std::to_string(first + env.local_size - 1);
    store.set(prefix + std::to_string(env.cross_rank), std::vector<uint8_t>(text.begin(), text.end()));
  }
  std::vector<JobNode> nodes;
  for (int k = 0; k < env.cross_size; ++k) {
    const auto bytes = store.get(prefix + std::to_string(k));
    std::istringstream in(std::string(bytes.begin(), bytes.end()));
    JobNode node;
    node.index = k;
    std::string first, last;
    std::getline(in, node.host);
    std::getline(in, node.address);
    std::getline(in, first);
    std::getline(in, last);
    node.first_rank = std::stoi(first);
    node.last_rank = std::stoi(last);
    nodes.push_back(node);
  }
  return nodes;
}

std::shared_ptr<Comm> make_gloo(const DistEnv& env, const c10::intrusive_ptr<c10d::Store>& store) {
  const std::string me = "rank " + std::to_string(env.rank) + "/" + std::to_string(env.world_size);
  // From here until every rank is connected, a failure on one rank stops all of them (startup_watch.h).
  StartupWatch watch(store, env, me + " on host " + host_name());
  auto fail = [&](const std::string& why) -> CommError {
    watch.report_failure(why);
    return CommError(me + ": " + why);
  };
  auto options = c10d::ProcessGroupGloo::Options::create(env.timeout);
  std::string bound, address;
  try {
    options->devices = gloo_devices(env, &bound, &address);
  } catch (const CommError& e) {
    throw fail(e.what());  // already names the master, the interfaces seen and GLOO_SOCKET_IFNAME
  } catch (const std::exception& e) {
    throw fail("cannot open a Gloo device (master " + env.master_addr + ", GLOO_SOCKET_IFNAME='" +
               env.gloo_socket_ifname + "'): " + e.what());
  }
  // One line per node of a job on several hosts, so its log says where each host's traffic goes (one host: loopback).
  if (env.local_rank == 0 && env.cross_size > 1)
    std::cerr << "[dscpp] node " << env.cross_rank << " (" << me << "): Gloo bound to " << bound << std::endl;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  try {
    group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, env.rank, env.world_size, options);
  } catch (const std::exception& e) {
    const auto* c10 = dynamic_cast<const c10::Error*>(&e);
    throw fail("connecting the Gloo process group (bound to " + bound + ") failed: " +
               connect_failure(env, c10 ? c10->what_without_backtrace() : e.what()));
  }
  auto comm = std::make_shared<ProcessGroupComm>(group, store, CommBackend::kGloo, env.rank, env.world_size, stream_prefix(env),
                                                 gloo_factory(options));
  // One collective while the watch still runs: past it every rank has connected, not only this one.
  try {
    comm->barrier();
  } catch (const std::exception& e) {
    throw fail("the start-up collective failed: " + std::string(e.what()));
  }
  if (env.cross_size > 1) {
    try {
      comm->set_nodes(exchange_nodes(*store, env, address), env.cross_rank);
    } catch (const std::exception& e) {
      throw fail("exchanging the nodes' addresses through the store failed: " + std::string(e.what()));
    }
  }
  return comm;
}

#ifdef DSCPP_WITH_NCCL
GroupFactory nccl_factory(c10::intrusive_ptr<c10d::ProcessGroupNCCL::Options> options) {
  return [options](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) {
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  };
}

// Tensors must live on this rank's GPU (the engine puts them on cuda:local_rank).
std::shared_ptr<Comm> make_nccl(const DistEnv& env, const c10::intrusive_ptr<c10d::Store>& store) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = env.timeout;
  auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.world_size, options);
  return std::make_shared<ProcessGroupComm>(group, store, CommBackend::kNccl, env.rank, env.world_size, stream_prefix(env),
                                            nccl_factory(options));
}
#endif

}  // namespace

std::shared_ptr<Comm> init_comm(const DistEnv& env, CommBackend backend) {
  if (env.world_size == 1) return make_single_process_comm();
#ifdef DSCPP_WITH_NCCL
  const bool nccl = backend == CommBackend::kNccl || (backend == CommBackend::kAuto && torch::cuda::is_available());
#else
  if (backend == CommBackend::kNccl) {
#ifdef DSCPP_TORCH_HAS_CUDA
    throw CommError("backend nccl was requested but this build has no NCCL: its LibTorch has CUDA, but CMake found "
                    "no nccl.h (rebuild with NCCL_HOME or CUDA_HOME set); use gloo");
#else
    throw CommError("backend nccl was requested but this build has no NCCL (its LibTorch has no CUDA); use gloo");
#endif
  }
  const bool nccl = false;
#endif
  auto store = rendezvous(env);
  std::shared_ptr<Comm> comm;
#ifdef DSCPP_WITH_NCCL
  if (nccl) comm = make_nccl(env, store);
#endif
  if (!nccl) comm = make_gloo(env, store);
  // Every rank has finished connecting before any returns, so rank 0 (the store's host) cannot exit while a
  // slower peer still reads the store.
  comm->barrier();
  return comm;
}

std::shared_ptr<Comm> make_comm_over(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                     const c10::intrusive_ptr<c10d::Store>& store, const std::string& backend,
                                     const std::string& key_prefix) {
  if (!group || !store) throw std::invalid_argument("make_comm_over: the process group or its store is null");
  if (backend != "gloo" && backend != "nccl") {
    throw std::invalid_argument("make_comm_over: backend '" + backend + "' is not supported (gloo or nccl)");
  }
  const CommBackend kind = backend == "nccl" ? CommBackend::kNccl : CommBackend::kGloo;
  const int rank = group->getRank();
  const int world_size = group->getSize();
  // The group dispatches to one Backend per device type: ours runs the collectives of that device.
  auto base = group->getBackend(kind == CommBackend::kNccl ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(key_prefix, store);
  // Sub-groups as init_comm's would be made, from the job's environment (torchrun's, which the group was made from).
  GroupFactory factory;
  if (kind == CommBackend::kGloo) {
    factory = [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) {
      const DistEnv env = DistEnv::from_env();
      auto options = c10d::ProcessGroupGloo::Options::create(env.timeout);
      options->devices = gloo_devices(env);
      return gloo_factory(options)(store, rank, size);
    };
  }
#ifdef DSCPP_WITH_NCCL
  if (kind == CommBackend::kNccl) {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = DistEnv::from_env().timeout;
    factory = nccl_factory(options);
  }
#endif
  return std::make_shared<ProcessGroupComm>(base, prefixed, kind, rank, world_size, key_prefix, std::move(factory));
}

}  // namespace dscpp
