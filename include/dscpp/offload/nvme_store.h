// State on NVMe (ZeRO-Infinity): one O_DIRECT swap file per rank under nvme_path. For the optimizer
// (offload_optimizer.device "nvme") it holds, per sub-group, its master and every optimizer state kind back to
// back; for ZeRO-3's parameters (offload_param.device "nvme") one sub-group per group shard. buffer_count
// aligned host buffers (page-locked when pin_memory and a GPU exists) each hold one sub-group: while sub-group i
// steps, i + 1 is read ahead into another and i - 1 is written back from a third, through AsyncIo.
//
// The file is unlinked as soon as it is open, so it disappears when the process exits however it exits (a crash
// leaves nothing under nvme_path); its space is reserved up front, so a full disk is an error at initialize, never
// in the middle of a step.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/config/config.h"
#include "dscpp/offload/async_io.h"
#include "dscpp/offload/state_store.h"

namespace dscpp {

struct NvmeStoreOptions {
  std::string nvme_path;       // an existing, writable directory
  std::string config_key;      // how errors name it, e.g. "zero_optimization.offload_optimizer.nvme_path"
  std::string role = "optimizer";  // names the file: dscpp-<pid>-<n>-rank<r>-<role>.swap
  int rank = 0;
  std::vector<int64_t> sub_group_sizes;  // elements per kind in each sub-group (uniform_sub_groups for a partition)
  int kinds = 1;               // the master plus the optimizer's state kinds
  torch::ScalarType dtype = torch::kFloat32;
  bool read_ahead = true;      // acquire(i) starts reading i + 1 (the optimizer's sweep); else only prefetch() does
  int buffer_count = 4;
  bool pin_memory = false;
  AioConfig aio;
  IoBackend backend = IoBackend::kAuto;
  // Fills sub-group i's fresh slices (master first) when the file is first written.
  std::function<void(int i, const std::vector<torch::Tensor>& slices)> initial_values;
};

class NvmeStore;

// Creates the swap file and writes every sub-group's initial values. Throws std::runtime_error naming the key and
// the path when the directory is missing or not writable, or when the disk lacks the space (with how much is needed
// and how much is free).
std::unique_ptr<StateStore> make_nvme_store(const NvmeStoreOptions& options);

}  // namespace dscpp
