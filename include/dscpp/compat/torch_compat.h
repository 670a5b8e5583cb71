// The one place that knows which LibTorch we build against: Debian's 1.13 (CPU) here, PyTorch 2.x's LibTorch where a
// GPU is lent. Everything else in the project calls these helpers instead of testing versions itself.
#pragma once

#include <torch/torch.h>
#include <torch/version.h>

#include <string>

#define DSCPP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace dscpp::compat {

// "1.13.0" etc.: for `dscpp report` and checkpoint manifests.
inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// 1.13's CPU kernels have no fp16 matmul; 2.x has. Tests and examples that need fp16 compute on CPU ask here.
constexpr bool kCpuHalfMatmul = DSCPP_TORCH_AT_LEAST(2, 0);

// Sets a parameter's gradient tensor. Both versions spell it mutable_grad(); kept here because 2.x warns about
// non-leaf access patterns that 1.13 allows, and we want one place to adjust.
inline void set_grad(torch::Tensor& param, const torch::Tensor& grad) { param.mutable_grad() = grad; }

}  // namespace dscpp::compat
