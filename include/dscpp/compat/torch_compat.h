// The one place that knows which LibTorch we build against: Debian's 1.13 (CPU) here, PyTorch 2.x's LibTorch where a
// GPU is lent. Everything else in the project calls these helpers instead of testing versions itself (tests may
// use DSCPP_TORCH_AT_LEAST to cover an entry point only one side has). The CUDA-only sources that include it are
// compile-checked with CUDA and NCCL on in the default tests (cuda_compile_check).
#pragma once

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#define DSCPP_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace c10d {
class ProcessGroup;
class Backend;  // 2.0+
}  // namespace c10d

namespace dscpp::compat {

// "1.13.0" etc.: for `dscpp report` and checkpoint manifests.
inline std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

// 1.13's CPU kernels have no fp16 matmul; 2.x has. Tests and examples that need fp16 compute on CPU ask here.
constexpr bool kCpuHalfMatmul = DSCPP_TORCH_AT_LEAST(2, 0);

// Whether LibTorch's CPU bf16 matrix products (mm, addmm, bmm above 16³ multiply-adds) run on oneDNN rather than
// ATen's own loop. Both accumulate in fp32 and round once, in different orders, so their bits differ; oneDNN also
// takes scratch memory through the CPU allocator's raw interface. The rule is ATen's mkldnn_bf16_device_check:
// oneDNN built in and enabled, and a CPU with AVX-512 BW, VL and DQ (2.x adds AVX2-VNNI-2 CPUs, not told apart here).
inline bool cpu_bf16_matmul_uses_onednn() {
  return at::hasMKLDNN() && at::globalContext().userEnabledMkldnn() && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// Causal attention in one fused kernel (flash / memory-efficient where the device has them) on 2.x; nothing on 1.13,
// whose callers spell the same math out.
inline std::optional<torch::Tensor> fused_causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                                                           const torch::Tensor& v, double dropout_p) {
#if DSCPP_TORCH_AT_LEAST(2, 0)
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, dropout_p, /*is_causal=*/true);
#else
  (void)q, (void)k, (void)v, (void)dropout_p;
  return std::nullopt;
#endif
}

// Runs `fn` each time autograd has finished accumulating a gradient into `param.grad()`: a post hook on the
// parameter's AccumulateGrad node, the node DeepSpeed hooks too (2.1+ also offers register_post_accumulate_grad_hook;
// 1.13 does not). The hook lives as long as the returned object: it keeps the node alive (the parameter holds it
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

// An allocator that wraps LibTorch's. Allocator::allocate is const in 1.13 and not in later releases, which also add
// a pure copy_data; declaring both forms of allocate (neither marked override) implements whichever the base has, so
// subclasses implement wrapped_allocate once for every LibTorch.
struct WrappingAllocator : c10::Allocator {
  c10::DataPtr allocate(size_t n) const { return wrapped_allocate(n); }
  c10::DataPtr allocate(size_t n) { return wrapped_allocate(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
  virtual c10::DataPtr wrapped_allocate(size_t n) const = 0;
};

// ---- c10d (src/comm includes c10d's headers through its c10d_headers.h; these need only the names) ----

// The class ProcessGroupGloo/ProcessGroupNCCL derive from, whose virtual collectives we call. 1.13: they are
// ProcessGroups. 2.0+: they are Backends (a ProcessGroup became a dispatcher over several Backends); the collective
// signatures we use (allreduce, broadcast, allgather, _allgather_base, _reduce_scatter_base, barrier) and the
// constructors (store, rank, size, options) are the same. Gloo's missing collectives are probed at start-up
// (BackendFeatures), not assumed from the version; NCCL has them natively on both.
#if DSCPP_TORCH_AT_LEAST(2, 0)
using ProcessGroupBase = c10d::Backend;
#else
using ProcessGroupBase = c10d::ProcessGroup;
#endif

// The ProcessGroupBase that runs a group's collectives on `device` — for a group made elsewhere (torch.distributed's,
// from Python). 2.0+: the group dispatches to one Backend per device type; 1.13: the group is its own. A template
// so that only its caller (src/comm, with c10d's headers) needs the complete types.
template <typename Group>
c10::intrusive_ptr<ProcessGroupBase> backend_of(const c10::intrusive_ptr<Group>& group, c10::DeviceType device) {
#if DSCPP_TORCH_AT_LEAST(2, 0)
  return group->getBackend(device);
#else
  (void)device;
  return group;
#endif
}

// SPEC §8 wants the rendezvous port bound to the master address only. c10d's TCPStore server listens on every
// interface (1.13 always: TCPServer calls Socket::listen(port) with no host). Since 2.x TCPStoreOptions can adopt a
// socket we bound ourselves (masterListenFd; honoured by the libuv server, the default since 2.4, from 2.8 on —
// PR 150215), so there we bind to master_addr. KNOWN LIMITATION below 2.8: the store port is open on all
// interfaces of rank 0's host while the job starts; restrict it with a firewall on shared networks.
constexpr bool kStoreAdoptsListenSocket = DSCPP_TORCH_AT_LEAST(2, 8);
template <class TCPStoreOptions>
void adopt_listen_socket([[maybe_unused]] TCPStoreOptions& options, [[maybe_unused]] int fd) {
#if DSCPP_TORCH_AT_LEAST(2, 8)
  options.masterListenFd = fd;
#endif
}

}  // namespace dscpp::compat
