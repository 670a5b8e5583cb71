// OrderCheck: comparing every rank's position before a ZeRO-3 demand or boundary.
#include "dscpp/zero/order_check.h"

#include <stdexcept>
#include <vector>

namespace dscpp {

OrderCheck::OrderCheck(std::shared_ptr<Comm> comm, std::function<std::string(int64_t)> describe_group)
    : comm_(std::move(comm)), describe_group_(std::move(describe_group)) {}

std::string OrderCheck::describe(const OrderPoint& p) const {
  const std::string where = "micro-step " + std::to_string(p.micro_step);
  if (p.kind == OrderPoint::kBoundary) return "the accumulation boundary after " + where;
  if (p.kind == OrderPoint::kDemand) {
    return "demand #" + std::to_string(p.index) + " of " + where + " (" + describe_group_(p.group) + ")";
  }
  return "an unknown point (kind " + std::to_string(p.kind) + ")";
}

void OrderCheck::expect_same(const OrderPoint& point) {
  const int world = comm_->world_size();
  if (world == 1) return;
  const std::vector<int64_t> mine = {point.kind, point.group, point.micro_step, point.index};
  const auto all = comm_->side_all_gather(mine);
  const size_t n = mine.size();
  bool same = true;
  for (size_t i = 0; i < all.size(); ++i) same = same && all[i] == mine[i % n];
  if (same) return;
  std::string ranks;
  for (int r = 0; r < world; ++r) {
    const OrderPoint p{all[r * n], all[r * n + 1], all[r * n + 2], all[r * n + 3]};
    ranks += "\n  rank " + std::to_string(r) + ": " + describe(p);
  }
  throw std::runtime_error(
      "ZeRO-3: ranks disagree on the next collective (rank " + std::to_string(comm_->rank()) + " is at " +
      describe(point) + "):" + ranks +
      "\nEvery rank must run the same gather units in the same order and the same number of forward/backward "
      "passes per step; a branch that differs between ranks, or a rank with fewer micro-batches, breaks that.");
}

}  // namespace dscpp
