// LR schedules against DeepSpeed's formulas (runtime/lr_schedules.py) written out at chosen steps:
// lr_at(t) is DeepSpeed's get_lr() with last_batch_iteration = t; t = -1 is what the schedule sets when built.
// (tests/conformance checks the same sequences against DeepSpeed itself.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "dscpp/schedule/lr_schedule.h"

namespace dscpp {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Relative 1e-12: the schedules are closed-form doubles, so only rounding may differ.
#define EXPECT_LR(actual, expected) EXPECT_NEAR((actual), (expected), 1e-12 * std::fabs(expected) + 1e-15)

std::unique_ptr<LRSchedule> make(SchedulerOptions options, double base_lr = 0.0, std::string type = "") {
  return make_lr_schedule(SchedulerConfig{std::move(type), std::move(options)}, base_lr);
}

WarmupLROptions warmup(double min, double max, int64_t steps, WarmupType type) {
  WarmupLROptions o;
  o.warmup_min_lr = min;
  o.warmup_max_lr = max;
  o.warmup_num_steps = steps;
  o.warmup_type = type;
  return o;
}

std::string error_of(SchedulerOptions options, double base_lr = 1.0, std::string type = "") {
  try {
    make(std::move(options), base_lr, std::move(type));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(WarmupLR, LogWarmup) {
  auto s = make(warmup(0.01, 0.11, 10, WarmupType::kLog));
  EXPECT_LR(s->lr_at(-1), 0.01);                                         // set when built: warmup_min_lr
  EXPECT_LR(s->lr_at(0), 0.01);                                          // ln(1) = 0
  EXPECT_LR(s->lr_at(1), 0.01 + 0.1 * (std::log(2.0) / std::log(10.0)));
  EXPECT_LR(s->lr_at(4), 0.01 + 0.1 * (std::log(5.0) / std::log(10.0)));
  EXPECT_LR(s->lr_at(9), 0.11);                                          // ln(10)/ln(10)
  EXPECT_LR(s->lr_at(10), 0.11);
  EXPECT_LR(s->lr_at(15), 0.11);
}

TEST(WarmupLR, LinearWarmup) {
  auto s = make(warmup(0.01, 0.11, 10, WarmupType::kLinear));
  EXPECT_LR(s->lr_at(0), 0.01);
  EXPECT_LR(s->lr_at(1), 0.02);   // 0.01 + 0.1 * 1/10
  EXPECT_LR(s->lr_at(9), 0.10);   // 0.01 + 0.1 * 9/10
  EXPECT_LR(s->lr_at(10), 0.11);
  EXPECT_LR(s->lr_at(15), 0.11);
}

TEST(WarmupLR, WarmupStepsClampedToTwo) {
  for (int64_t n : {1}) {
    auto lin = make(warmup(0.0, 1.0, n, WarmupType::kLinear));
    EXPECT_LR(lin->lr_at(0), 0.0);
    EXPECT_LR(lin->lr_at(1), 0.5);  // t / 2
    EXPECT_LR(lin->lr_at(2), 1.0);
    auto log = make(warmup(0.0, 1.0, n, WarmupType::kLog));
    EXPECT_LR(log->lr_at(1), 1.0);  // ln 2 / ln 2
  }
}

TEST(WarmupDecayLR, WarmsUpThenDecaysLinearlyToZero) {
  WarmupDecayLROptions o;
  o.warmup = warmup(0.0, 0.1, 10, WarmupType::kLinear);
  o.total_num_steps = 30;
  auto s = make(o);
  EXPECT_LR(s->lr_at(-1), 0.0);
  EXPECT_LR(s->lr_at(0), 0.0);
  EXPECT_LR(s->lr_at(1), 0.01);
  EXPECT_LR(s->lr_at(9), 0.09);
  EXPECT_LR(s->lr_at(10), 0.1);    // (30-10)/(30-10)
  EXPECT_LR(s->lr_at(15), 0.075);  // (30-15)/20
  EXPECT_LR(s->lr_at(29), 0.005);  // 1/20
  EXPECT_LR(s->lr_at(30), 0.0);
  EXPECT_LR(s->lr_at(35), 0.0);    // max(0, negative)

  o.warmup.warmup_type = WarmupType::kLog;
  auto log = make(o);
  EXPECT_LR(log->lr_at(4), 0.1 * std::log(5.0) / std::log(10.0));
  EXPECT_LR(log->lr_at(15), 0.075);
}

TEST(WarmupCosineLR, ScalesTheOptimizerLr) {
  WarmupCosineLROptions o;
  o.total_num_steps = 20;
  o.warmup_num_steps = 4;
  o.warmup_min_ratio = 0.1;
  o.cos_min_ratio = 0.01;
  o.warmup_type = WarmupType::kLinear;
  auto s = make(o, /*base_lr=*/0.5);
  EXPECT_LR(s->lr_at(-1), 0.0);  // set when built: 0, not the warmup's first ratio
  EXPECT_LR(s->lr_at(0), 0.5 * 0.1);
  EXPECT_LR(s->lr_at(1), 0.5 * (0.1 + 0.25 * 0.9));
  EXPECT_LR(s->lr_at(3), 0.5 * (0.1 + 0.75 * 0.9));
  // After warmup: real_last_step = t - 4 + 1, real_total_steps = 16.
  EXPECT_LR(s->lr_at(4), 0.5 * (0.01 + 0.99 * (1 + std::cos(kPi * 1 / 16)) / 2));
  EXPECT_LR(s->lr_at(9), 0.5 * (0.01 + 0.99 * (1 + std::cos(kPi * 6 / 16)) / 2));
  EXPECT_LR(s->lr_at(19), 0.5 * 0.01);  // cos(pi) = -1
  // Past total_num_steps the cosine's progress is clamped: the ratio stays at cos_min_ratio.
  EXPECT_LR(s->lr_at(20), 0.5 * 0.01);
  EXPECT_LR(s->lr_at(100), 0.5 * 0.01);

  // total_num_steps at the warmup's length: no cosine, every step after the warmup at cos_min_ratio.
  o.total_num_steps = 4;
  EXPECT_LR(make(o, 0.5)->lr_at(4), 0.5 * 0.01);
  o.total_num_steps = 20;

  o.warmup_type = WarmupType::kLog;
  auto log = make(o, 0.5);
  EXPECT_LR(log->lr_at(1), 0.5 * (0.1 + 0.9 * std::log(2.0) / std::log(4.0)));
}

OneCycleOptions one_cycle() {
  OneCycleOptions o;
  o.cycle_min_lr = 0.001;
  o.cycle_max_lr = 0.011;
  o.cycle_first_step_size = 4;
  o.cycle_second_step_size = 6;  // total 10, rising for 40%
  o.decay_step_size = 2;
  o.decay_lr_rate = 0.5;
  o.cycle_min_mom = 0.8;
  o.cycle_max_mom = 0.9;
  o.decay_mom_rate = 0.01;
  return o;
}

TEST(OneCycle, CyclesLrAndMomentumThenDecays) {
  auto s = make(one_cycle());
  // Set when built: the minimum lr and the minimum momentum, beta2 0.99 (as DeepSpeed writes them).
  EXPECT_LR(s->lr_at(-1), 0.001);
  EXPECT_LR(s->betas_at(-1)->beta1, 0.8);
  EXPECT_EQ(s->betas_at(-1)->beta2, 0.99);
  // x = (t+1)/10 within the cycle; scale = x/0.4 rising, (x-1)/(0.4-1) falling.
  EXPECT_LR(s->lr_at(0), 0.001 + 0.01 * 0.25);
  EXPECT_LR(s->betas_at(0)->beta1, 0.9 - 0.1 * 0.25);
  EXPECT_EQ(s->betas_at(0)->beta2, 0.99);
  EXPECT_LR(s->lr_at(2), 0.001 + 0.01 * 0.75);
  EXPECT_LR(s->lr_at(3), 0.011);  // the peak
  EXPECT_LR(s->betas_at(3)->beta1, 0.8);
  EXPECT_LR(s->lr_at(4), 0.001 + 0.01 * (5.0 / 6.0));
  EXPECT_LR(s->betas_at(4)->beta1, 0.9 - 0.1 * (5.0 / 6.0));
  EXPECT_LR(s->lr_at(8), 0.001 + 0.01 * (1.0 / 6.0));
  EXPECT_LR(s->lr_at(9), 0.001);  // (t+1) = 10 starts cycle 2 at x = 0
  EXPECT_LR(s->betas_at(9)->beta1, 0.9);
  // Decay: d = t - 10 + 1, lr = min / (1 + rate * d / decay_step_size), mom = max * (1 + mom_rate * d / size).
  EXPECT_LR(s->lr_at(10), 0.001 / (1 + 0.5 * 0.5));
  EXPECT_LR(s->betas_at(10)->beta1, 0.9 * (1 + 0.01 * 0.5));
  EXPECT_LR(s->lr_at(13), 0.001 / (1 + 0.5 * 2.0));
  EXPECT_LR(s->betas_at(13)->beta1, 0.9 * (1 + 0.01 * 2.0));
}

TEST(OneCycle, DefaultsAndDisabledParts) {
  OneCycleOptions o = one_cycle();
  o.cycle_first_step_size = 5;
  o.cycle_second_step_size = -1;  // same as first: symmetric
  o.decay_step_size = 0;          // no decay
  auto s = make(o);
  EXPECT_LR(s->lr_at(1), 0.001 + 0.01 * 0.4);
  EXPECT_LR(s->lr_at(4), 0.011);
  EXPECT_LR(s->lr_at(6), 0.001 + 0.01 * 0.6);  // x = 0.7: (0.7-1)/(0.5-1)
  EXPECT_LR(s->lr_at(25), 0.001);
  EXPECT_LR(s->betas_at(25)->beta1, 0.9);

  o.cycle_momentum = false;
  EXPECT_FALSE(make(o)->betas_at(3).has_value());
  EXPECT_FALSE(make(o)->betas_at(-1).has_value());
}

// Stair counts hold the lr flat over equal parts of each half, counted from the step's place in the cycle.
TEST(OneCycle, StairCountsHoldTheLrFlat) {
  OneCycleOptions o = one_cycle();
  o.cycle_first_step_size = 5;
  o.cycle_second_step_size = -1;  // total 10
  o.decay_step_size = 0;
  o.cycle_first_stair_count = 3;  // the second half takes the first's count when not given
  auto s = make(o);
  EXPECT_LR(s->lr_at(-1), 0.001);
  EXPECT_LR(s->lr_at(0), 0.001);                   // floor(1 * 3/5) = 0
  EXPECT_LR(s->lr_at(1), 0.001 + 0.01 / 3.0);      // floor(2 * 3/5) = 1
  EXPECT_LR(s->lr_at(2), 0.001 + 0.01 / 3.0);      // floor(1.8)
  EXPECT_LR(s->lr_at(3), 0.001 + 0.02 / 3.0);      // floor(2.4)
  EXPECT_LR(s->lr_at(4), 0.011);                   // floor(3): the peak is reached, not dropped a stair
  EXPECT_LR(s->lr_at(6), 0.001 + 0.01 / 3.0);      // falling: floor((10 - 7) * 3/5)
  EXPECT_LR(s->betas_at(4)->beta1, 0.8);
  o.cycle_second_stair_count = 1;
  auto one = make(o);
  EXPECT_LR(one->lr_at(5), 0.001);                 // falling, one stair: floor((10 - 6) / 5) = 0
  EXPECT_LR(one->lr_at(1), 0.001 + 0.01 / 3.0);    // the first half keeps its three
}

TEST(LRRangeTest, ContinuousAndStaircase) {
  LRRangeTestOptions o;
  o.lr_range_test_min_lr = 0.01;
  o.lr_range_test_step_size = 4;
  o.lr_range_test_step_rate = 0.5;
  auto s = make(o);
  EXPECT_LR(s->lr_at(-1), 0.01);  // set when built: min_lr
  EXPECT_LR(s->lr_at(0), 0.01 * (1 + 0.5 * 0.25));
  EXPECT_LR(s->lr_at(3), 0.01 * 1.5);
  EXPECT_LR(s->lr_at(10), 0.01 * (1 + 0.5 * 2.75));
  o.lr_range_test_staircase = true;
  auto stairs = make(o);
  EXPECT_LR(stairs->lr_at(0), 0.01);
  EXPECT_LR(stairs->lr_at(2), 0.01);
  EXPECT_LR(stairs->lr_at(3), 0.015);
  EXPECT_LR(stairs->lr_at(10), 0.02);  // floor(11/4) = 2
}

TEST(ConstantLR, ReturnsTheBaseLr) {
  ConstantLR s(3e-4);
  EXPECT_EQ(s.lr_at(0), 3e-4);
  EXPECT_EQ(s.lr_at(1000000), 3e-4);
  EXPECT_LR(s.lr_at(-1), 3e-4);
  EXPECT_FALSE(s.betas_at(5).has_value());
}

TEST(LRScheduleValidation, ErrorsNameTheKey) {
  auto has = [](const std::string& msg, const std::string& key) { return msg.find(key) != std::string::npos; };
  EXPECT_TRUE(has(error_of(warmup(0.0, 1e-3, -1, WarmupType::kLog)), "scheduler.params.warmup_num_steps"));
  EXPECT_TRUE(has(error_of(warmup(0.0, 1e-3, 0, WarmupType::kLog)), "must be a positive integer"));
  EXPECT_TRUE(has(error_of(warmup(-1.0, 1e-3, 10, WarmupType::kLog)), "scheduler.params.warmup_min_lr"));

  WarmupDecayLROptions decay;
  decay.warmup = warmup(0.0, 1e-3, 10, WarmupType::kLog);
  EXPECT_TRUE(has(error_of(decay), "scheduler.params.total_num_steps"));  // left at 0: required
  decay.total_num_steps = 5;
  EXPECT_TRUE(has(error_of(decay), "scheduler.params.total_num_steps"));  // below warmup
  decay.total_num_steps = 10;
  EXPECT_EQ(error_of(decay), "no error");

  WarmupCosineLROptions cosine;
  cosine.warmup_num_steps = 4;
  EXPECT_TRUE(has(error_of(cosine), "scheduler.params.total_num_steps"));  // left at 0: required
  cosine.total_num_steps = 20;
  cosine.cos_min_ratio = 1.5;
  EXPECT_TRUE(has(error_of(cosine), "scheduler.params.cos_min_ratio"));
  cosine.cos_min_ratio = 0.0;
  EXPECT_TRUE(has(error_of(cosine, /*base_lr=*/-1.0), "scheduler.params.lr"));

  OneCycleOptions cycle = one_cycle();
  cycle.cycle_first_step_size = 0;
  EXPECT_TRUE(has(error_of(cycle), "scheduler.params.cycle_first_step_size"));
  cycle = one_cycle();
  cycle.cycle_max_mom = 1.2;
  EXPECT_TRUE(has(error_of(cycle), "scheduler.params.cycle_max_mom"));
  cycle = one_cycle();
  cycle.decay_step_size = -3;
  EXPECT_TRUE(has(error_of(cycle), "scheduler.params.decay_step_size"));

  LRRangeTestOptions range;
  range.lr_range_test_step_size = 0;
  EXPECT_TRUE(has(error_of(range), "scheduler.params.lr_range_test_step_size"));

  EXPECT_TRUE(has(error_of(warmup(0.0, 1e-3, 10, WarmupType::kLog), 1.0, "OneCycle"), "scheduler.type"));
  EXPECT_EQ(error_of(warmup(0.0, 1e-3, 10, WarmupType::kLog), 1.0, "warmuplr"), "no error");
}

}  // namespace
}  // namespace dscpp
