// RngState: the random-number generators a block's forward draws from, captured so the block can be run again
// with the same draws (activation checkpointing's recompute must drop out the same units it dropped the first time),
// and so a checkpoint can resume a run's draws exactly.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <utility>

namespace dscpp {

class RngState {
 public:
  // The default CPU generator, and the default generator of `device` when it is a CUDA device.
  static RngState capture(const torch::Device& device);
  // States read back from a checkpoint: `cuda` (defined when `cuda_device` is given) goes to that device's generator.
  RngState(torch::Tensor cpu, std::optional<torch::Device> cuda_device, torch::Tensor cuda)
      : cpu_(std::move(cpu)), cuda_device_(cuda_device), cuda_(std::move(cuda)) {}

  // The generators' opaque state tensors (cuda() undefined unless captured on a CUDA device).
  const torch::Tensor& cpu() const { return cpu_; }
  const torch::Tensor& cuda() const { return cuda_; }

  // Sets the generators to this state.
  void restore() const;

 private:
  RngState() = default;
  torch::Tensor cpu_;
  std::optional<torch::Device> cuda_device_;
  torch::Tensor cuda_;
};

// Runs as the guard's scope with the generators set to `state`, then puts back what they were, so the draws the
// training loop makes after a recompute are the ones it would have made without one.
class ScopedRngState {
 public:
  ScopedRngState(const RngState& state, const torch::Device& device)
      : saved_(RngState::capture(device)) {
    state.restore();
  }
  ~ScopedRngState() { saved_.restore(); }
  ScopedRngState(const ScopedRngState&) = delete;
  ScopedRngState& operator=(const ScopedRngState&) = delete;

 private:
  RngState saved_;
};

}  // namespace dscpp
