// Host memory for offloaded model states (ZeRO-Offload): fp32 tensors on the CPU, page-locked when asked and a GPU
// exists, so copies between them and the device can run asynchronously (DeepSpeed's pin_memory).
#pragma once

#include <torch/torch.h>

namespace dscpp {

// fp32 on the CPU; pinned when `pin_memory` and CUDA is available (without a GPU pinning has no meaning and
// LibTorch cannot do it).
torch::TensorOptions host_options(bool pin_memory);

}  // namespace dscpp
