// RngState: generator states are opaque byte tensors; the generator's own mutex guards each read and write.
#include "dscpp/activation/rng_state.h"

#include <mutex>

namespace dscpp {
namespace {

torch::Tensor get_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_state(at::Generator generator, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace

RngState RngState::capture(const torch::Device& device) {
  RngState s;
  s.cpu_ = get_state(at::detail::getDefaultCPUGenerator());
  if (device.is_cuda()) {
    s.cuda_device_ = device;
    s.cuda_ = get_state(at::globalContext().defaultGenerator(device));
  }
  return s;
}

void RngState::restore() const {
  set_state(at::detail::getDefaultCPUGenerator(), cpu_);
  if (cuda_device_) set_state(at::globalContext().defaultGenerator(*cuda_device_), cuda_);
}

}  // namespace dscpp
