// squared_norm_fp64: ‖t‖² of a 1-D tensor as a 0-dim fp64 tensor, cheap and accurate enough that every stage and
// world size computes the same clipping coefficient.
#pragma once

#include <torch/torch.h>

namespace dscpp {

// Rows of 64 Ki elements are normed in t's own dtype (accurate at that length) and their squares summed in fp64.
// A float norm over millions of elements drifts by ~1e-5 relative; a full fp64 pass costs ~30x more time.
torch::Tensor squared_norm_fp64(const torch::Tensor& t);

}  // namespace dscpp
