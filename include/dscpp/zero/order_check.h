// OrderCheck: ZeRO-3's guard against ranks that disagree on what comes next. At each demand for a group (and at
// each accumulation boundary) every rank says where it is — which group, which micro-step, which demand of it.
// Everything else a rank does follows from the demands and the record, so as long as the demands agree the
// collectives pair up; the first point that differs (a branch that differs between ranks, a rank with fewer
// micro-batches) stops every rank with an error saying where each one was, instead of wrong parameters or a hang.
//
// Where the comm has a SideStream (a TCPStore), a point can be posted and left to a checker thread, which reads the
// peers' points in order and compares them; Stage 3 does so for the demands its gather record predicted (every rank
// following the record issues the same collectives) and waits with expect_same at the others and at boundaries.
// Waiting at every demand cost ZeRO-3 a lockstep round trip through rank 0's store per demand (18% of a 2-process
// step of Python's GPT, bench/python_overhead). Nothing is lost by checking later: expect_same waits until every
// point before it is verified, so no optimizer step follows a disagreement, and on one the checker interrupts the
// comm, so a rank blocked in a collective its peers will never join stops with the disagreement. Without a stream
// every point is exchanged blocking, in place.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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
  // `group_names[g]` names group g in errors (e.g. "h.3").
  OrderCheck(std::shared_ptr<Comm> comm, std::vector<std::string> group_names);
  // Stops the checker. One blocked reading a point that will not come (a peer died) is left to end with the store.
  ~OrderCheck();
  OrderCheck(const OrderCheck&) = delete;
  OrderCheck& operator=(const OrderCheck&) = delete;

  // Posts `point` to be compared behind. Throws std::runtime_error when a disagreement is already known.
  void post(const OrderPoint& point);
  // Posts `point` and blocks until it and every point before it are compared across ranks; throws
  // std::runtime_error when any differed (CommError when the peers could no longer be reached).
  void expect_same(const OrderPoint& point);

  struct State;  // shared with the checker thread (order_check.cpp)

 private:
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<State> state_;
  std::thread checker_;
};

}  // namespace dscpp
