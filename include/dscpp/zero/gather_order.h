// GatherOrder: the order in which ZeRO-3 groups are needed within a micro-step (forward, then backward), recorded
// on the first micro-step and replayed afterwards so the next groups can be gathered ahead of their use. Pure
// bookkeeping, no tensors: the stage asks it what comes next and how far away a group's next use is.
//
// If a micro-step departs from the record (a branch taken differently), the rest of that micro-step is traced
// afresh and the new sequence replaces the old at its end: one slower micro-step, never a wrong gather.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace dscpp {

class GatherOrder {
 public:
  void begin_micro_step();

  // Group `group` is needed now. Returns true when it is the one the record predicted.
  bool demand(int group);

  // Adopts the traced sequence when this micro-step departed from the record (or there was none).
  void end_micro_step();

  // True while the record is being followed: prefetching is only done then.
  bool replaying() const { return !tracing_; }

  // The recorded demands after the current one, nearest first.
  std::vector<int> upcoming() const;

  // Sum of `group_numel` over the demands between the current one and the next demand of `group`, or nullopt
  // when `group` is not needed again this micro-step (or the record is not being followed).
  std::optional<int64_t> reuse_distance(int group, const std::vector<int64_t>& group_numel) const;

  const std::vector<int>& recorded() const { return recorded_; }

 private:
  std::vector<int> recorded_;  // the last complete micro-step's demands
  std::vector<int> trace_;     // this micro-step's demands so far
  size_t position_ = 0;        // demands seen this micro-step
  bool tracing_ = true;
};

}  // namespace dscpp
