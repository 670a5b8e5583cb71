// rank_device: the device guard interface is LibTorch's device-generic way to switch GPUs; it needs no CUDA headers,
// so this file compiles the same against a CPU-only LibTorch (where cuda is never chosen) and a CUDA one.
#include "dscpp/engine/device.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/cuda.h>

#include <stdexcept>

namespace dscpp {

torch::Device rank_device(const std::string& requested, int local_rank) {
  if (requested != "cpu" && requested != "cuda" && requested != "auto") {
    throw std::invalid_argument("device '" + requested + "': expected cpu, cuda or auto");
  }
  const int64_t gpus = static_cast<int64_t>(torch::cuda::device_count());
  if (requested == "cpu" || (requested == "auto" && gpus == 0)) return torch::kCPU;
  if (gpus == 0) {
#ifdef DSCPP_TORCH_HAS_CUDA
    throw std::invalid_argument("device cuda: no GPU is visible to this process (check nvidia-smi and "
                                "CUDA_VISIBLE_DEVICES); use cpu");
#else
    throw std::invalid_argument("device cuda: this build's torch has no CUDA (build against a CUDA torch wheel, "
                                "docs/torch.md); use cpu");
#endif
  }
  if (local_rank < 0) throw std::invalid_argument("device cuda: LOCAL_RANK is negative");
  return {torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % gpus)};
}

CommBackend comm_backend_for(const torch::Device& device, int local_size) {
  const auto gpus = static_cast<int64_t>(torch::cuda::device_count());
  return device.is_cuda() && local_size <= gpus ? CommBackend::kNccl : CommBackend::kGloo;
}

void make_current(const torch::Device& device) {
  if (!device.is_cuda()) return;
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
}

torch::ScalarType to_scalar_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return torch::kFloat32;
    case DType::kFloat16: return torch::kFloat16;
    case DType::kBFloat16: return torch::kBFloat16;
  }
  throw std::logic_error("to_scalar_type: unknown DType");
}

}  // namespace dscpp
