// RngState: the random-number generators a block's forward draws from, captured so the block can be run again
// with the same draws (activation checkpointing's recompute must drop out the same units it dropped the first time).
#pragma once

#include <torch/torch.h>

#include <optional>

namespace dscpp {

class RngState {
 public:
  // The default CPU generator, and the default generator of `device` when it is a CUDA device.
  static RngState capture(const torch::Device& device);

  // Sets the generators to this state.
  void restore() const;

 private:
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
