// DSCPP_KILL_AT's grammar: what it accepts, and a clear error naming the variable for what it does not.
#include <gtest/gtest.h>

#include "../common/error_of.h"
#include "dscpp/fault/kill_point.h"

namespace dscpp::fault {
namespace {

using dscpp::testing::error_of;

TEST(KillRule, ParsesPointHitRankAndRestart) {
  auto rule = parse_kill_rule("engine.backward");
  EXPECT_EQ(rule.point, "engine.backward");
  EXPECT_EQ(rule.hit, 1);
  EXPECT_EQ(rule.rank, -1);
  EXPECT_EQ(rule.restart, 0);
  rule = parse_kill_rule("comm.collective@240,rank=3,restart=1");
  EXPECT_EQ(rule.point, "comm.collective");
  EXPECT_EQ(rule.hit, 240);
  EXPECT_EQ(rule.rank, 3);
  EXPECT_EQ(rule.restart, 1);
  for (const auto& point : kKillPoints) EXPECT_EQ(parse_kill_rule(point + "@2").point, point);
}

TEST(KillRule, RefusesWhatItCannotMean) {
  EXPECT_NE(error_of([] { parse_kill_rule("engine.backwards"); })
                .find("DSCPP_KILL_AT: unknown point 'engine.backwards' (known: engine.forward, engine.backward,"),
            std::string::npos);
  EXPECT_EQ(error_of([] { parse_kill_rule("engine.step@0"); }), "DSCPP_KILL_AT: @N '0' must be an integer >= 1");
  EXPECT_EQ(error_of([] { parse_kill_rule("engine.step@2x"); }), "DSCPP_KILL_AT: @N '2x' must be an integer >= 1");
  EXPECT_EQ(error_of([] { parse_kill_rule("engine.step,rank=-1"); }),
            "DSCPP_KILL_AT: rank '-1' must be an integer >= 0");
  EXPECT_EQ(error_of([] { parse_kill_rule("engine.step,restart="); }),
            "DSCPP_KILL_AT: restart '' must be an integer >= 0");
  EXPECT_EQ(error_of([] { parse_kill_rule("engine.step,node=1"); }),
            "DSCPP_KILL_AT: unknown field 'node=1' (expected POINT[@N][,rank=R][,restart=K])");
}

}  // namespace
}  // namespace dscpp::fault
