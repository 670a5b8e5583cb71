// init_comm: rendezvous, then a Gloo (CPU) or NCCL (GPU) process group wrapped as a Comm. The Gloo device is chosen
// so that a loopback master keeps all traffic on loopback; otherwise GLOO_SOCKET_IFNAME picks the NIC, or, unset, the
// interface that reaches the master (gloo_interface.h).
#include <iostream>
#include <sstream>

#include "dscpp/comm/gloo_interface.h"
#include "process_group_comm.h"
#include "rendezvous.h"

namespace dscpp {
namespace {

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

// Gloo's devices for this rank. `bound` (if given) gets a line for the start-up log naming what was bound and why.
std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices(const DistEnv& env, std::string* bound = nullptr) {
  auto say = [&](const std::string& line) {
    if (bound != nullptr) *bound = line;
  };
  if (is_loopback(env.master_addr)) {
    say("loopback " + env.master_addr + " (the master is on this host)");
    return {c10d::ProcessGroupGloo::createDeviceForHostname(env.master_addr)};
  }
  if (!env.gloo_socket_ifname.empty()) {
    std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
    std::stringstream names(env.gloo_socket_ifname);
    for (std::string name; std::getline(names, name, ',');)
      if (!name.empty()) devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
    say(env.gloo_socket_ifname + " (GLOO_SOCKET_IFNAME)");
    return devices;
  }
  // Gloo's default device binds to what the hostname resolves to, often loopback: choose as NCCL does instead.
  const GlooBinding binding =
      choose_gloo_binding(gather_binding_inputs(env.master_addr, env.master_port, env.cross_size > 1));
  say(binding.interface + " " + binding.address + " (" + binding.reason + "; MASTER_ADDR " + env.master_addr + ")");
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

std::shared_ptr<Comm> make_gloo(const DistEnv& env, const c10::intrusive_ptr<c10d::Store>& store) {
  const std::string me = "rank " + std::to_string(env.rank) + "/" + std::to_string(env.world_size);
  auto options = c10d::ProcessGroupGloo::Options::create(env.timeout);
  std::string bound;
  try {
    options->devices = gloo_devices(env, &bound);
  } catch (const CommError&) {
    throw;  // already names the master, the interfaces seen and GLOO_SOCKET_IFNAME
  } catch (const std::exception& e) {
    throw CommError(me + ": cannot open a Gloo device (master " + env.master_addr + ", GLOO_SOCKET_IFNAME='" +
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
    throw CommError(me + ": connecting the Gloo process group failed: " +
                    (c10 ? c10->what_without_backtrace() : e.what()) +
                    ". A peer rank probably died during start-up; see its log.");
  }
  BackendFeatures features;
  try {
    features = probe_features(*group, env.world_size);
  } catch (const std::exception& e) {
    throw CommError(me + ": the start-up collective failed: " + std::string(e.what()) +
                    ". A peer rank probably died; see its log.");
  }
  return std::make_shared<ProcessGroupComm>(group, store, "gloo", env.rank, env.world_size, features,
                                            stream_prefix(env), gloo_factory(options));
}

#ifdef DSCPP_WITH_NCCL
GroupFactory nccl_factory(c10::intrusive_ptr<c10d::ProcessGroupNCCL::Options> options) {
  return [options](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) {
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  };
}

// NCCL does bf16, reduce-scatter and flat all-gather natively. Tensors must live on this rank's GPU (the engine
// puts them on cuda:local_rank).
std::shared_ptr<Comm> make_nccl(const DistEnv& env, const c10::intrusive_ptr<c10d::Store>& store) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = env.timeout;
  auto group = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, env.rank, env.world_size, options);
  return std::make_shared<ProcessGroupComm>(group, store, "nccl", env.rank, env.world_size,
                                            BackendFeatures{true, true, true}, stream_prefix(env),
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
  const int rank = group->getRank();
  const int world_size = group->getSize();
  auto base = compat::backend_of(group, backend == "nccl" ? c10::DeviceType::CUDA : c10::DeviceType::CPU);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(key_prefix, store);
  // NCCL has every feature natively; Gloo's are probed, as init_comm does.
  const BackendFeatures features = backend == "nccl" ? BackendFeatures{true, true, true}
                                                     : probe_features(*base, world_size);
  // Sub-groups as init_comm's would be made, from the job's environment (torchrun's, which the group was made from).
  GroupFactory factory;
  if (backend == "gloo") {
    factory = [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size) {
      const DistEnv env = DistEnv::from_env();
      auto options = c10d::ProcessGroupGloo::Options::create(env.timeout);
      options->devices = gloo_devices(env);
      return gloo_factory(options)(store, rank, size);
    };
  }
#ifdef DSCPP_WITH_NCCL
  if (backend == "nccl") {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = DistEnv::from_env().timeout;
    factory = nccl_factory(options);
  }
#endif
  return std::make_shared<ProcessGroupComm>(base, prefixed, backend, rank, world_size, features, key_prefix,
                                            std::move(factory));
}

}  // namespace dscpp
