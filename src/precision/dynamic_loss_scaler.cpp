// The dynamic fp16 loss scaler: DeepSpeed's DynamicLossScaler.update_scale arithmetic, step for step,
// so a config tuned on DeepSpeed skips the same steps here. Only the messages and the error differ.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "dscpp/precision/loss_scaler.h"
#include "scale_format.h"

namespace dscpp {
namespace {

constexpr double kScaleFactor = 2.0;  // DeepSpeed's scale_factor: halve on overflow, double on growth

class DynamicLossScaler final : public LossScaler {
 public:
  DynamicLossScaler(const LossScalerOptions& options, std::function<void(const std::string&)> log)
      : options_(options),
        scale_(std::ldexp(1.0, options.initial_scale_power)),
        hysteresis_(options.hysteresis),
        log_(std::move(log)) {}

  double scale() const override { return scale_; }

  bool update(bool overflow, int64_t step) override {
    if (overflow) {
      on_overflow(step);
    } else {
      on_good_step();
    }
    ++iteration_;
    return overflow;
  }

  LossScalerState state() const override { return {scale_, iteration_, last_overflow_iteration_, hysteresis_}; }

  void load_state(const LossScalerState& state) override {
    if (!(state.scale > 0.0) || !std::isfinite(state.scale)) {
      throw std::invalid_argument("loss scaler state: scale must be finite and > 0, got " +
                                  detail::format_scale(state.scale));
    }
    if (state.hysteresis < 1 || state.iteration < 0 || state.last_overflow_iteration < -1 ||
        state.last_overflow_iteration >= state.iteration) {
      throw std::invalid_argument("loss scaler state is inconsistent (iteration " + std::to_string(state.iteration) +
                                  ", last_overflow_iteration " + std::to_string(state.last_overflow_iteration) +
                                  ", hysteresis " + std::to_string(state.hysteresis) + ")");
    }
    scale_ = state.scale;
    iteration_ = state.iteration;
    last_overflow_iteration_ = state.last_overflow_iteration;
    hysteresis_ = state.hysteresis;
  }

  std::string name() const override { return "dynamic"; }

 private:
  void on_overflow(int64_t step) {
    const std::string where = "[deepspeed.cpp] step " + std::to_string(step) + ": gradient overflow; ";
    if (options_.hysteresis == 1 || hysteresis_ == 1) {
      // DeepSpeed compares for equality too: a scale above the minimum may still halve onto it once.
      if (scale_ == options_.min_scale) {
        throw LossScaleAtMinimumError(
            where + "the loss scale is already at its minimum (current scale " + detail::format_scale(scale_) +
            ", fp16.min_loss_scale " + detail::format_scale(options_.min_scale) +
            ") and cannot be lowered further, so no step can be taken. The gradients overflow even unscaled: "
            "look for inf/nan sources in the model or data, lower the learning rate, enable "
            "\"gradient_clipping\", or train in bf16 (\"bf16\": {\"enabled\": true}); lowering "
            "fp16.min_loss_scale only helps if the overflows are rare");
      }
      const double next = std::max(scale_ / kScaleFactor, options_.min_scale);
      if (log_) {
        log_(where + "loss scale " + detail::format_scale(scale_) + " -> " + detail::format_scale(next) +
             ", step skipped");
      }
      scale_ = next;
    } else {
      if (log_) {
        log_(where + "hysteresis " + std::to_string(hysteresis_) + " -> " + std::to_string(hysteresis_ - 1) +
             ", scale stays " + detail::format_scale(scale_) + ", step skipped");
      }
      --hysteresis_;
    }
    last_overflow_iteration_ = iteration_;
  }

  void on_good_step() {
    if (options_.consecutive_hysteresis) hysteresis_ = options_.hysteresis;
    // Counted from the last overflow (or from -1 at the start), so the first growth comes after
    // scale_window good updates and the window restarts at every overflow.
    if ((iteration_ - last_overflow_iteration_) % options_.scale_window == 0) {
      if (!options_.consecutive_hysteresis) hysteresis_ = options_.hysteresis;
      scale_ *= kScaleFactor;
    }
  }

  LossScalerOptions options_;
  double scale_;
  int64_t iteration_ = 0;                 // updates seen (DeepSpeed's cur_iter)
  int64_t last_overflow_iteration_ = -1;  // DeepSpeed's last_overflow_iter
  int hysteresis_;                        // overflows left before the scale halves (cur_hysteresis)
  std::function<void(const std::string&)> log_;
};

}  // namespace

std::unique_ptr<LossScaler> make_dynamic_scaler(const LossScalerOptions& options,
                                                std::function<void(const std::string&)> log) {
  if (options.initial_scale_power < 0 || options.initial_scale_power > 64) {
    throw std::invalid_argument("fp16.initial_scale_power must be in [0, 64] (the scale starts at "
                                "2^initial_scale_power), got " + std::to_string(options.initial_scale_power));
  }
  if (options.scale_window < 1) {
    throw std::invalid_argument("fp16.loss_scale_window must be >= 1, got " + std::to_string(options.scale_window));
  }
  if (options.hysteresis < 1) {
    throw std::invalid_argument("fp16.hysteresis must be >= 1, got " + std::to_string(options.hysteresis));
  }
  if (!(options.min_scale > 0.0) || !std::isfinite(options.min_scale)) {
    throw std::invalid_argument("fp16.min_loss_scale must be finite and > 0, got " +
                                detail::format_scale(options.min_scale));
  }
  return std::make_unique<DynamicLossScaler>(options, std::move(log));
}

}  // namespace dscpp
