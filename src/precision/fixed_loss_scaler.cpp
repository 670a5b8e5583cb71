// The two scalers whose scale never changes: the unit scaler (fp32/bf16, where any inf/nan is fatal)
// and the static scaler (fp16 with "loss_scale" > 0, where an overflowing step is skipped).
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "dscpp/precision/loss_scaler.h"
#include "scale_format.h"

namespace dscpp {
namespace {

// fp32/bf16 have the range not to need scaling, so an inf/nan gradient is a real divergence: stop and say
// where, instead of silently skipping steps forever.
class UnitLossScaler final : public LossScaler {
 public:
  double scale() const override { return 1.0; }

  bool update(bool overflow, int64_t step) override {
    if (overflow) {
      throw NonFiniteGradientError(
          "non-finite gradient (inf/nan) at step " + std::to_string(step) +
          "; training without loss scaling (fp32/bf16) cannot skip it. Lower the learning rate, enable "
          "\"gradient_clipping\", or look for the inf/nan source in the data or the model (e.g. log of 0, "
          "division by 0)");
    }
    ++iteration_;
    return false;
  }

  LossScalerState state() const override { return {1.0, iteration_, -1, 1}; }
  void load_state(const LossScalerState& state) override { iteration_ = state.iteration; }
  std::string name() const override { return "unit"; }

 private:
  int64_t iteration_ = 0;
};

// A fixed scale: an overflow skips the step and keeps the scale, as DeepSpeed's static LossScaler does.
class StaticLossScaler final : public LossScaler {
 public:
  StaticLossScaler(double scale, std::function<void(const std::string&)> log)
      : scale_(scale), log_(std::move(log)) {}

  double scale() const override { return scale_; }

  bool update(bool overflow, int64_t step) override {
    if (overflow) {
      last_overflow_iteration_ = iteration_;
      if (log_) {
        log_("[deepspeed.cpp] step " + std::to_string(step) + ": gradient overflow; static loss scale " +
             detail::format_scale(scale_) + " kept, step skipped");
      }
    }
    ++iteration_;
    return overflow;
  }

  LossScalerState state() const override { return {scale_, iteration_, last_overflow_iteration_, 1}; }

  // The scale comes from the config, not the checkpoint: a resumed run with a new "loss_scale" uses it.
  void load_state(const LossScalerState& state) override {
    iteration_ = state.iteration;
    last_overflow_iteration_ = state.last_overflow_iteration;
  }

  std::string name() const override { return "static"; }

 private:
  double scale_;
  int64_t iteration_ = 0;
  int64_t last_overflow_iteration_ = -1;
  std::function<void(const std::string&)> log_;
};

}  // namespace

std::unique_ptr<LossScaler> make_unit_scaler() { return std::make_unique<UnitLossScaler>(); }

std::unique_ptr<LossScaler> make_static_scaler(double scale, std::function<void(const std::string&)> log) {
  if (!(scale > 0.0) || !std::isfinite(scale)) {
    throw std::invalid_argument("fp16.loss_scale must be a finite number > 0 for a static scale (0 selects the "
                                "dynamic scaler), got " + detail::format_scale(scale));
  }
  return std::make_unique<StaticLossScaler>(scale, std::move(log));
}

}  // namespace dscpp
