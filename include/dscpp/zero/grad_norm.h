// squared_norm_fp64: ‖t‖² of a tensor as a 0-dim fp64 tensor, every square summed in fp64 as DeepSpeed's ZeRO does
// for the global gradient norm it clips by — so the clip coefficient matches DeepSpeed's, and every stage and world
// size computes the same one.
#pragma once

#include <torch/torch.h>

namespace dscpp {

torch::Tensor squared_norm_fp64(const torch::Tensor& t);

}  // namespace dscpp
