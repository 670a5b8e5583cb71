// Which device a rank trains on. DeepSpeed gives each rank the GPU its LOCAL_RANK names and makes it current before
// anything is allocated there (get_accelerator().set_device(local_rank)); gpt-train and the engine both go through
// here, so they cannot disagree.
#pragma once

#include <torch/torch.h>

#include <string>

#include "dscpp/comm/comm.h"
#include "dscpp/config/config.h"

namespace dscpp {

// `requested` is "cpu", "cuda" or "auto" (cuda where LibTorch sees a GPU, else cpu). A CUDA rank gets
// cuda:<local_rank>; with more local ranks than GPUs (tests, or a job sharing one GPU) ranks wrap around and share
// (see comm_backend_for). Throws std::invalid_argument naming the request and what this machine has: "cuda" with no
// GPU visible (or a LibTorch built without CUDA), anything but the three words.
torch::Device rank_device(const std::string& requested, int local_rank);

// The process group for training on `device` with `local_size` ranks on this node: NCCL for GPUs, Gloo for the CPU
// and for ranks that share a GPU (more local ranks than GPUs: NCCL allows one rank per device).
CommBackend comm_backend_for(const torch::Device& device, int local_size);

// Makes `device` the current CUDA device of this thread (a no-op for CPU devices), so LibTorch's streams, the
// caching allocator and NCCL's communicator all use it.
void make_current(const torch::Device& device);

// The config's dtype (compute_dtype, communication_data_type) as LibTorch's.
torch::ScalarType to_scalar_type(DType dtype);

}  // namespace dscpp
