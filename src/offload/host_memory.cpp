// Host memory for offloaded model states.
#include "dscpp/offload/host_memory.h"

#include <torch/cuda.h>

namespace dscpp {

torch::TensorOptions host_options(bool pin_memory) {
  auto options = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU);
  return pin_memory && torch::cuda::is_available() ? options.pinned_memory(true) : options;
}

}  // namespace dscpp
