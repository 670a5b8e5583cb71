// GatherOrder: what ZeRO-3's prefetch is told comes next — recorded on the first micro-step, followed after, and
// re-traced (never trusted) when a micro-step departs from it.
#include <gtest/gtest.h>

#include "dscpp/zero/gather_order.h"

namespace dscpp {
namespace {

void run(GatherOrder& order, const std::vector<int>& demands) {
  order.begin_micro_step();
  for (int g : demands) order.demand(g);
  order.end_micro_step();
}

TEST(GatherOrder, RecordsTheFirstMicroStepAndPredictsFromTheSecond) {
  GatherOrder order;
  order.begin_micro_step();
  EXPECT_FALSE(order.replaying());
  EXPECT_FALSE(order.demand(0));
  EXPECT_TRUE(order.upcoming().empty()) << "nothing to prefetch while tracing";
  for (int g : {1, 2, 2, 1}) order.demand(g);
  order.end_micro_step();
  EXPECT_EQ(order.recorded(), (std::vector<int>{0, 1, 2, 2, 1}));

  order.begin_micro_step();
  EXPECT_TRUE(order.replaying());
  EXPECT_TRUE(order.demand(0));
  EXPECT_EQ(order.upcoming(), (std::vector<int>{1, 2, 2, 1}));
  EXPECT_TRUE(order.demand(1));
  // Group 1 is next needed after 2 and 2 again: 2 × group 2's size away; group 0 not again this micro-step.
  const std::vector<int64_t> numel = {100, 10, 7};
  EXPECT_EQ(order.reuse_distance(1, numel), 14);
  EXPECT_EQ(order.reuse_distance(2, numel), 0);
  EXPECT_FALSE(order.reuse_distance(0, numel).has_value());
}

TEST(GatherOrder, ADepartureStopsPredictionAndReplacesTheRecord) {
  GatherOrder order;
  run(order, {0, 1, 2, 3, 3, 2, 1});
  order.begin_micro_step();
  EXPECT_TRUE(order.demand(0));
  EXPECT_FALSE(order.demand(2)) << "block 1 skipped";
  EXPECT_FALSE(order.replaying());
  EXPECT_TRUE(order.upcoming().empty());
  EXPECT_FALSE(order.reuse_distance(3, {1, 1, 1, 1}).has_value());
  for (int g : {3, 3, 2}) order.demand(g);
  order.end_micro_step();
  EXPECT_EQ(order.recorded(), (std::vector<int>{0, 2, 3, 3, 2}));
  // Back to the long path: departs again at the second demand, and the record follows.
  run(order, {0, 1, 2, 3, 3, 2, 1});
  EXPECT_EQ(order.recorded(), (std::vector<int>{0, 1, 2, 3, 3, 2, 1}));
}

TEST(GatherOrder, AMicroStepThatStopsShortIsADepartureToo) {
  GatherOrder order;
  run(order, {0, 1, 1});
  run(order, {0});  // an evaluation forward: only the root
  EXPECT_EQ(order.recorded(), (std::vector<int>{0}));
}

}  // namespace
}  // namespace dscpp
