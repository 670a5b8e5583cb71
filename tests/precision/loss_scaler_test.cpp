// Loss scalers against hand-computed sequences of DeepSpeed's DynamicLossScaler: every
// expected scale / hysteresis / skip flag below is written out, not recomputed by a second implementation.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dscpp/precision/loss_scaler.h"

namespace dscpp {
namespace {

constexpr bool O = true;   // overflow
constexpr bool G = false;  // good step

LossScalerOptions options(int power, int64_t window, int hysteresis, bool consecutive = false, double min = 1.0) {
  LossScalerOptions o;
  o.initial_scale_power = power;
  o.scale_window = window;
  o.hysteresis = hysteresis;
  o.consecutive_hysteresis = consecutive;
  o.min_scale = min;
  return o;
}

struct Trace {
  std::vector<double> scales;  // after each update
  std::vector<int> hysteresis;
  std::vector<bool> skipped;
};

// Feeds `pattern` (step numbers 1, 2, ...) and records the scaler after each update.
Trace run(LossScaler& scaler, const std::vector<bool>& pattern) {
  Trace trace;
  int64_t step = 1;
  for (bool overflow : pattern) {
    trace.skipped.push_back(scaler.update(overflow, step++));
    trace.scales.push_back(scaler.scale());
    trace.hysteresis.push_back(scaler.state().hysteresis);
  }
  return trace;
}

TEST(DynamicLossScaler, StartsAtTwoToTheInitialPower) {
  EXPECT_EQ(make_dynamic_scaler(options(16, 1000, 2))->scale(), 65536.0);
  EXPECT_EQ(make_dynamic_scaler(options(0, 1000, 2))->scale(), 1.0);
}

TEST(DynamicLossScaler, DoublesAfterEachWindowWithoutOverflow) {
  auto scaler = make_dynamic_scaler(options(4, 3, 2));
  Trace t = run(*scaler, {G, G, G, G, G, G});  // 2 windows
  EXPECT_EQ(t.scales, (std::vector<double>{16, 16, 32, 32, 32, 64}));
  EXPECT_EQ(t.skipped, (std::vector<bool>{false, false, false, false, false, false}));
  EXPECT_EQ(scaler->state().iteration, 6);
  EXPECT_EQ(scaler->state().last_overflow_iteration, -1);
}

TEST(DynamicLossScaler, WindowOfOneDoublesEveryStep) {
  auto scaler = make_dynamic_scaler(options(1, 1, 1));
  EXPECT_EQ(run(*scaler, {G, G, G}).scales, (std::vector<double>{4, 8, 16}));
}

TEST(DynamicLossScaler, HysteresisTwoFirstOverflowOnlyDecrements) {
  std::vector<std::string> lines;
  auto scaler = make_dynamic_scaler(options(10, 100, 2), [&](const std::string& l) { lines.push_back(l); });
  Trace t = run(*scaler, {O, O, O});
  EXPECT_EQ(t.scales, (std::vector<double>{1024, 512, 256}));
  // Not refilled after a halving: only a full window of good steps refills it.
  EXPECT_EQ(t.hysteresis, (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(t.skipped, (std::vector<bool>{true, true, true}));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "[deepspeed.cpp] step 1: gradient overflow; hysteresis 2 -> 1, scale stays 1024, step skipped");
  EXPECT_EQ(lines[1], "[deepspeed.cpp] step 2: gradient overflow; loss scale 1024 -> 512, step skipped");
  EXPECT_EQ(lines[2], "[deepspeed.cpp] step 3: gradient overflow; loss scale 512 -> 256, step skipped");
}

TEST(DynamicLossScaler, GrowthWindowRestartsAfterOverflow) {
  auto scaler = make_dynamic_scaler(options(4, 3, 1));
  //                         it: 0  1  2  3  4  5  6  7  8
  Trace t = run(*scaler, {G, G, O, G, G, G, G, G, G});
  EXPECT_EQ(t.scales, (std::vector<double>{16, 16, 8, 8, 8, 16, 16, 16, 32}));
  EXPECT_EQ(t.skipped, (std::vector<bool>{false, false, true, false, false, false, false, false, false}));
  EXPECT_EQ(scaler->state().last_overflow_iteration, 2);
}

TEST(DynamicLossScaler, GrowthRefillsHysteresis) {
  auto scaler = make_dynamic_scaler(options(4, 2, 2));
  //                         it: 0  1  2  3  4  5
  Trace t = run(*scaler, {O, G, O, G, G, O});
  EXPECT_EQ(t.scales, (std::vector<double>{16, 16, 8, 8, 16, 16}));
  EXPECT_EQ(t.hysteresis, (std::vector<int>{1, 1, 1, 1, 2, 1}));
}

TEST(DynamicLossScaler, ConsecutiveHysteresisRefillsOnEveryGoodStep) {
  auto scaler = make_dynamic_scaler(options(4, 100, 2, /*consecutive=*/true));
  Trace t = run(*scaler, {O, G, O, O, G, O});
  EXPECT_EQ(t.scales, (std::vector<double>{16, 16, 16, 8, 8, 8}));
  EXPECT_EQ(t.hysteresis, (std::vector<int>{1, 2, 1, 1, 2, 1}));

  // The same pattern without it: the good step does not refill, so the second overflow halves.
  auto plain = make_dynamic_scaler(options(4, 100, 2));
  EXPECT_EQ(run(*plain, {O, G, O, O, G, O}).scales, (std::vector<double>{16, 16, 8, 4, 4, 2}));
}

TEST(DynamicLossScaler, HalvingStopsAtMinScaleThenErrors) {
  auto scaler = make_dynamic_scaler(options(2, 1000, 1));
  EXPECT_TRUE(scaler->update(O, 1));
  EXPECT_EQ(scaler->scale(), 2.0);
  EXPECT_TRUE(scaler->update(O, 2));
  EXPECT_EQ(scaler->scale(), 1.0);  // reached the minimum: still a normal skip, not an error
  try {
    scaler->update(O, 3);
    FAIL() << "expected LossScaleAtMinimumError";
  } catch (const LossScaleAtMinimumError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("step 3"), std::string::npos) << msg;
    EXPECT_NE(msg.find("current scale 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fp16.min_loss_scale 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gradient_clipping"), std::string::npos) << msg;
  }
  EXPECT_EQ(scaler->scale(), 1.0);
}

TEST(DynamicLossScaler, ClampsToMinScaleBeforeErroring) {
  auto scaler = make_dynamic_scaler(options(3, 1000, 1, false, /*min=*/3.0));
  EXPECT_EQ(run(*scaler, {O, O}).scales, (std::vector<double>{4, 3}));  // 8 -> 4 -> max(2, 3)
  EXPECT_THROW(scaler->update(O, 3), LossScaleAtMinimumError);
}

TEST(DynamicLossScaler, HysteresisIsSpentBeforeTheMinimumError) {
  auto scaler = make_dynamic_scaler(options(0, 1000, 2));  // already at min_scale 1
  EXPECT_TRUE(scaler->update(O, 1));                        // hysteresis 2 -> 1: no error yet
  EXPECT_EQ(scaler->state().hysteresis, 1);
  EXPECT_THROW(scaler->update(O, 2), LossScaleAtMinimumError);
}

TEST(DynamicLossScaler, LogsOneLinePerOverflowOnly) {
  int lines = 0;
  auto scaler = make_dynamic_scaler(options(8, 2, 2, true), [&](const std::string&) { ++lines; });
  run(*scaler, {G, O, G, G, G, O, O, G});
  EXPECT_EQ(lines, 3);
}

TEST(DynamicLossScaler, StateRoundTripContinuesIdentically) {
  const LossScalerOptions o = options(6, 3, 2);
  auto a = make_dynamic_scaler(o);
  run(*a, {O, G});
  const LossScalerState s = a->state();
  EXPECT_EQ(s.scale, 64.0);
  EXPECT_EQ(s.iteration, 2);
  EXPECT_EQ(s.last_overflow_iteration, 0);
  EXPECT_EQ(s.hysteresis, 1);

  auto b = make_dynamic_scaler(o);
  b->load_state(s);
  EXPECT_EQ(b->state().scale, s.scale);
  EXPECT_EQ(b->state().iteration, s.iteration);
  EXPECT_EQ(b->state().last_overflow_iteration, s.last_overflow_iteration);
  EXPECT_EQ(b->state().hysteresis, s.hysteresis);
  const std::vector<bool> rest{G, O, G, G, G, G, O, O};
  Trace ta = run(*a, rest);
  Trace tb = run(*b, rest);
  EXPECT_EQ(ta.scales, tb.scales);
  EXPECT_EQ(ta.hysteresis, tb.hysteresis);
  // Written out: it2 G (2-0=2), it3 O halves 64->32 (last=3), it4..5 G, it6 G grows (6-3=3; h refilled to 2),
  // it7 G, it8 O (h 2 -> 1, scale stays), it9 O halves 64->32.
  EXPECT_EQ(ta.scales, (std::vector<double>{64, 32, 32, 32, 64, 64, 64, 32}));
}

TEST(DynamicLossScaler, RejectsBadOptionsAndState) {
  auto message = [](const LossScalerOptions& o) {
    try {
      make_dynamic_scaler(o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(options(16, 0, 2)).find("fp16.loss_scale_window"), std::string::npos);
  EXPECT_NE(message(options(16, 10, 0)).find("fp16.hysteresis"), std::string::npos);
  EXPECT_NE(message(options(-1, 10, 2)).find("fp16.initial_scale_power"), std::string::npos);
  EXPECT_NE(message(options(16, 10, 2, false, 0.0)).find("fp16.min_loss_scale"), std::string::npos);

  auto scaler = make_dynamic_scaler(options(16, 10, 2));
  EXPECT_THROW(scaler->load_state({0.0, 5, -1, 2}), std::invalid_argument);
  EXPECT_THROW(scaler->load_state({1024.0, 5, -1, 0}), std::invalid_argument);
  EXPECT_THROW(scaler->load_state({1024.0, 5, 5, 1}), std::invalid_argument);
}

TEST(StaticLossScaler, SkipsOverflowsAndKeepsItsScale) {
  std::vector<std::string> lines;
  auto scaler = make_static_scaler(128.0, [&](const std::string& l) { lines.push_back(l); });
  Trace t = run(*scaler, {G, O, G, O, O});
  EXPECT_EQ(t.scales, (std::vector<double>{128, 128, 128, 128, 128}));
  EXPECT_EQ(t.skipped, (std::vector<bool>{false, true, false, true, true}));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "[deepspeed.cpp] step 2: gradient overflow; static loss scale 128 kept, step skipped");
  EXPECT_EQ(scaler->state().iteration, 5);
  EXPECT_EQ(scaler->state().last_overflow_iteration, 4);

  auto restored = make_static_scaler(128.0);
  restored->load_state(scaler->state());
  EXPECT_EQ(restored->state().iteration, 5);
  EXPECT_EQ(restored->state().last_overflow_iteration, 4);
  EXPECT_EQ(restored->scale(), 128.0);

  EXPECT_THROW(make_static_scaler(0.0), std::invalid_argument);
  EXPECT_THROW(make_static_scaler(-2.0), std::invalid_argument);
}

TEST(UnitLossScaler, ScaleOneAndNonFiniteGradientNamesTheStep) {
  auto scaler = make_unit_scaler();
  EXPECT_EQ(scaler->scale(), 1.0);
  EXPECT_FALSE(scaler->update(false, 11));
  try {
    scaler->update(true, 12);
    FAIL() << "expected NonFiniteGradientError";
  } catch (const NonFiniteGradientError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("non-finite gradient (inf/nan) at step 12; ", 0), 0u) << msg;
  }
  EXPECT_EQ(scaler->scale(), 1.0);
  EXPECT_EQ(scaler->state().iteration, 1);
}

}  // namespace
}  // namespace dscpp
