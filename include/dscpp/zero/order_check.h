// OrderCheck: ZeRO-3's guard against ranks that disagree on what comes next. Before acting on each demand for a
// group (and at each accumulation boundary) every rank says where it is — which group, which micro-step, which
// demand of it — over the comm's side channel (the rendezvous store, so the check never waits behind a gather in
// flight). Everything else a rank does follows from the demands and the record, so as long as the demands agree
// the collectives pair up; the first demand that differs (a branch that differs between ranks, a rank with fewer
// micro-batches) stops every rank with an error saying where each one was, instead of wrong parameters or a hang.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "dscpp/comm/comm.h"

namespace dscpp {

struct OrderPoint {
  enum Kind : int64_t { kDemand = 1, kBoundary = 2 };
  int64_t kind = kDemand;
  int64_t group = -1;       // the group demanded (kDemand)
  int64_t micro_step = 0;   // forward/backward passes completed before this one
  int64_t index = 0;        // demands so far in this micro-step
};

class OrderCheck {
 public:
  // `describe_group(g)` names group g in errors (e.g. "h.3").
  OrderCheck(std::shared_ptr<Comm> comm, std::function<std::string(int64_t)> describe_group);

  // Blocks until every rank has reached its next point; throws std::runtime_error when they differ.
  void expect_same(const OrderPoint& point);

 private:
  std::string describe(const OrderPoint& point) const;

  std::shared_ptr<Comm> comm_;
  std::function<std::string(int64_t)> describe_group_;
};

}  // namespace dscpp
