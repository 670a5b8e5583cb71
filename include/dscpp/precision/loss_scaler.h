// Loss scalers: how the loss is scaled before backward and what happens when gradients overflow.
// A scaler is a type chosen once from the config (no scaling, static, dynamic), never a flag in the engine.
// Torch-free: the engine tells the scaler whether this step's gradients overflowed (agreed across ranks).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace dscpp {

// Options of DeepSpeed's "fp16" section that drive the scaler.
struct LossScalerOptions {
  double static_scale = 0.0;        // "loss_scale": > 0 selects a static scale; 0 = dynamic
  int initial_scale_power = 16;     // dynamic scale starts at 2^initial_scale_power
  int64_t scale_window = 1000;      // "loss_scale_window": good steps before the scale doubles
  int hysteresis = 2;               // overflows tolerated before the scale halves ("delayed shift")
  bool consecutive_hysteresis = false;  // refill hysteresis on every good step
  double min_scale = 1.0;           // "min_loss_scale"
};

// Everything a checkpoint must hold to resume the scaler exactly.
struct LossScalerState {
  double scale = 1.0;
  int64_t iteration = 0;            // updates seen (DeepSpeed's cur_iter)
  int64_t last_overflow_iteration = -1;
  int hysteresis = 1;               // hysteresis left
};

// Thrown when the dynamic scale must go below min_loss_scale: training cannot make progress.
class LossScaleAtMinimumError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thrown when a non-scaled run (fp32/bf16) produces inf/nan gradients: we stop rather than train through it.
class NonFiniteGradientError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class LossScaler {
 public:
  virtual ~LossScaler() = default;

  // The factor the loss is multiplied by before backward.
  virtual double scale() const = 0;

  // Called once per optimizer boundary with whether any rank's gradients had inf/nan.
  // Returns true if the optimizer step must be skipped. `step` is the optimizer step number (for messages).
  virtual bool update(bool overflow, int64_t step) = 0;

  virtual LossScalerState state() const = 0;
  virtual void load_state(const LossScalerState& state) = 0;
  virtual std::string name() const = 0;
};

// fp32 and bf16: scale 1. An overflow is an error naming the step (never train through NaN).
std::unique_ptr<LossScaler> make_unit_scaler();

// fp16 with "loss_scale" > 0: fixed scale; an overflowing step is skipped, the scale stays.
// `log` receives one line per overflow; may be empty. Throws std::invalid_argument unless scale is finite and > 0.
std::unique_ptr<LossScaler> make_static_scaler(double scale,
                                               std::function<void(const std::string&)> log = {});

// fp16 with "loss_scale" 0: DeepSpeed's DynamicLossScaler arithmetic, exactly.
// `log` receives one line per overflow (the engine routes it to rank 0's log); may be empty.
// update() throws LossScaleAtMinimumError on an overflow that would need a scale below min_scale.
// Throws std::invalid_argument naming the "fp16.<key>" for options it cannot use.
std::unique_ptr<LossScaler> make_dynamic_scaler(const LossScalerOptions& options,
                                                std::function<void(const std::string&)> log = {});

}  // namespace dscpp
