// What the engine needs of LibTorch beyond its public C++ API, in one place: the torch we build against
// (docs/torch.md: PyTorch 2.11 from PyPI), oneDNN's choice of CPU bf16 kernels, the AccumulateGrad hook ZeRO's
// reductions hang on, and ZeRO-3's in-place storage release. Nothing else reaches into LibTorch's internals.
#pragma once

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <functional>
#include <memory>
#include <string>

namespace dscpp::compat {

// "2.11.0" etc.: for `dscpp report` and checkpoint manifests.
inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// Whether LibTorch's CPU bf16 matrix products (mm, addmm, bmm above 16³ multiply-adds) run on oneDNN rather than
// ATen's own loop. Both accumulate in fp32 and round once, in different orders, so their bits differ; oneDNN also
// takes scratch memory through the CPU allocator's raw interface. The rule is ATen's mkldnn_bf16_device_check:
// oneDNN built in and enabled, and a CPU with AVX-512 BW, VL and DQ (torch also takes AVX2-VNNI-2 CPUs, not told apart
// here).
inline bool cpu_bf16_matmul_uses_onednn() {
  return at::hasMKLDNN() && at::globalContext().userEnabledMkldnn() && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// Runs `fn` each time autograd has finished accumulating a gradient into `param.grad()`: a post hook on the
// parameter's AccumulateGrad node, the node DeepSpeed hooks too (Python's register_post_accumulate_grad_hook has no
// C++ spelling). The hook lives as long as the returned object: it keeps the node alive (the parameter holds it
// only weakly, and a new node would not carry the hook) and removes the hook when destroyed, so a graph that
// outlives the owner never calls into it.
class PostAccumulateGradHook {
 public:
  PostAccumulateGradHook(const torch::Tensor& param, std::function<void()> fn)
      : node_(torch::autograd::impl::grad_accumulator(param)) {
    struct Hook final : torch::autograd::FunctionPostHook {
      explicit Hook(std::function<void()> f) : f_(std::move(f)) {}
      torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                                const torch::autograd::variable_list&) override {
        f_();
        return outputs;
      }
      std::function<void()> f_;
    };
    key_ = node_->add_post_hook(std::make_unique<Hook>(std::move(fn)));
  }
  ~PostAccumulateGradHook() { node_->del_post_hook(key_); }
  PostAccumulateGradHook(const PostAccumulateGradHook&) = delete;
  PostAccumulateGradHook& operator=(const PostAccumulateGradHook&) = delete;

 private:
  std::shared_ptr<torch::autograd::Node> node_;
  uintptr_t key_ = 0;
};

// ZeRO-3 frees a gathered buffer while views of it live on (the parameters' views, autograd's saved views), and
// later re-allocates it in place: the views follow the storage, so none of them has to be rebuilt. This is what
// FSDP does with storage().resize_(0); LibTorch has no device-generic C++ spelling of that, so we swap the
// StorageImpl's DataPtr through its own allocator (the caching allocator on CUDA).
inline void release_storage(const torch::Tensor& tensor) {
  auto* impl = tensor.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  impl->set_nbytes(0);
}

inline void allocate_storage(const torch::Tensor& tensor, size_t nbytes) {
  auto* impl = tensor.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
  impl->set_nbytes(nbytes);
}

inline size_t storage_bytes(const torch::Tensor& tensor) { return tensor.storage().nbytes(); }

}  // namespace dscpp::compat
