// Which ZeRO-3 parameters persist: stay whole on every rank (small ones: biases, norms) instead of partitioned and
// gathered for each use. DeepSpeed's rule (DeepSpeedZeRoOffload.mark_persistent_parameters), decided parameter by
// parameter in order: one persists when it has at most `stage3_param_persistence_threshold` elements and the
// parameters persisted so far plus it stay within `stage3_model_persistence_threshold` elements in all.
#pragma once

#include <cstdint>

namespace dscpp {

class PersistenceRule {
 public:
  PersistenceRule(int64_t param_threshold, int64_t model_threshold)
      : param_threshold_(param_threshold), model_threshold_(model_threshold) {}

  // Whether the next parameter in order, of `numel` elements, persists; counts it when it does.
  bool admit(int64_t numel) {
    // The model-wide bound first, as DeepSpeed checks it (written as a difference so that the default bound,
    // the largest int64, cannot overflow).
    if (numel > model_threshold_ - persisted_) return false;
    if (numel > param_threshold_) return false;
    persisted_ += numel;
    return true;
  }

 private:
  int64_t param_threshold_;
  int64_t model_threshold_;
  int64_t persisted_ = 0;
};

}  // namespace dscpp
