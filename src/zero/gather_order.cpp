// GatherOrder: recording and replaying the sequence of group demands.
#include "dscpp/zero/gather_order.h"

namespace dscpp {

void GatherOrder::begin_micro_step() {
  trace_.clear();
  position_ = 0;
  tracing_ = recorded_.empty();
}

bool GatherOrder::demand(int group) {
  const bool predicted = !tracing_ && position_ < recorded_.size() && recorded_[position_] == group;
  if (!predicted) tracing_ = true;
  trace_.push_back(group);
  ++position_;
  return predicted;
}

void GatherOrder::end_micro_step() {
  // A micro-step that stopped short of the record (fewer demands) departed from it too.
  if (tracing_ || position_ != recorded_.size()) recorded_ = trace_;
  tracing_ = false;
}

std::vector<int> GatherOrder::upcoming() const {
  if (tracing_ || position_ >= recorded_.size()) return {};
  return {recorded_.begin() + static_cast<std::ptrdiff_t>(position_), recorded_.end()};
}

std::optional<int64_t> GatherOrder::reuse_distance(int group, const std::vector<int64_t>& group_numel) const {
  if (tracing_) return std::nullopt;
  int64_t distance = 0;
  for (size_t i = position_; i < recorded_.size(); ++i) {
    if (recorded_[i] == group) return distance;
    distance += group_numel[recorded_[i]];
  }
  return std::nullopt;
}

}  // namespace dscpp
