// The pipeline's schedule and partitioning, without processes: exact 1F1B sequences, what a stage keeps in flight,
// a simulation of every stage together (blocking receives, sends that do not wait) that must finish for every size,
// and DeepSpeed's partition methods with their errors.
#include <gtest/gtest.h>

#include <deque>
#include <map>

#include "dscpp/pipe/partition.h"
#include "dscpp/pipe/schedule.h"

namespace dscpp::testing {
namespace {

TEST(PipeSchedule, TwoStagesThreeMicroBatchesInDeepSpeedsOrder) {
  EXPECT_EQ(describe(train_schedule(2, 0, 3)), "F0 S0 F1 S1 r0 B0 F2 S2 r1 B1 r2 B2");
  EXPECT_EQ(describe(train_schedule(2, 1, 3)), "R0 F0 B0 s0 R1 F1 B1 s1 R2 F2 B2 s2");
}

TEST(PipeSchedule, FourStagesWarmUpByTheirDistanceFromTheEnd) {
  EXPECT_EQ(describe(train_schedule(4, 0, 4)), "F0 S0 F1 S1 F2 S2 F3 S3 r0 B0 r1 B1 r2 B2 r3 B3");
  EXPECT_EQ(describe(train_schedule(4, 1, 4)), "R0 F0 S0 R1 F1 S1 R2 F2 S2 r0 B0 s0 R3 F3 S3 r1 B1 s1 r2 B2 s2 r3 B3 s3");
  EXPECT_EQ(describe(train_schedule(4, 3, 2)), "R0 F0 B0 s0 R1 F1 B1 s1");
  // Fewer micro-batches than stages: the warm-up is all of them.
  EXPECT_EQ(describe(train_schedule(4, 0, 2)), "F0 S0 F1 S1 r0 B0 r1 B1");
}

TEST(PipeSchedule, OneStageIsPlainGradientAccumulation) {
  EXPECT_EQ(describe(train_schedule(1, 0, 3)), "F0 B0 F1 B1 F2 B2");
}

// Every micro-batch forwarded once and backpropagated once after its forward; activations held at once never exceed
// max_in_flight = min(p − s, m), which is not m (1F1B's point: memory by depth, not by micro-batches).
TEST(PipeSchedule, EachStageHoldsAtMostItsDepthInFlight) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 8, 16}) {
      for (int s = 0; s < p; ++s) {
        int live = 0, peak = 0, forwards = 0, backwards = 0;
        std::vector<int> state(m, 0);
        for (const auto& i : train_schedule(p, s, m)) {
          if (i.op == PipeOp::kForward) {
            ASSERT_EQ(state[i.micro], 0);
            state[i.micro] = 1, ++forwards, peak = std::max(peak, ++live);
          } else if (i.op == PipeOp::kBackward) {
            ASSERT_EQ(state[i.micro], 1) << "backward before forward";
            state[i.micro] = 2, ++backwards, --live;
          }
        }
        EXPECT_EQ(forwards, m);
        EXPECT_EQ(backwards, m);
        EXPECT_EQ(peak, max_in_flight(p, s, m)) << "p " << p << " s " << s << " m " << m;
        EXPECT_EQ(peak, std::min(p - s, m));
      }
    }
  }
}

// All stages run together: a receive blocks until its peer's matching send has happened (one channel per direction
// between neighbours, in order); a send never blocks. Every stage must reach its end, and every receive must get
// the micro-batch it names.
TEST(PipeSchedule, AllStagesTogetherNeverDeadlock) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 5, 8, 16}) {
      std::vector<std::vector<PipeInstruction>> schedules;
      for (int s = 0; s < p; ++s) schedules.push_back(train_schedule(p, s, m));
      std::vector<size_t> pc(p, 0);
      std::map<std::pair<int, int>, std::deque<int>> channel;  // (from, to) → micro-batches sent, in order
      bool progress = true;
      while (progress) {
        progress = false;
        for (int s = 0; s < p; ++s) {
          while (pc[s] < schedules[s].size()) {
            const auto& i = schedules[s][pc[s]];
            if (i.op == PipeOp::kSendActivation) channel[{s, s + 1}].push_back(i.micro);
            if (i.op == PipeOp::kSendGrad) channel[{s, s - 1}].push_back(i.micro);
            if (i.op == PipeOp::kRecvActivation || i.op == PipeOp::kRecvGrad) {
              auto& c = channel[{i.op == PipeOp::kRecvActivation ? s - 1 : s + 1, s}];
              if (c.empty()) break;  // blocked
              ASSERT_EQ(c.front(), i.micro) << "p " << p << " m " << m << " stage " << s;
              c.pop_front();
            }
            ++pc[s];
            progress = true;
          }
        }
      }
      for (int s = 0; s < p; ++s) EXPECT_EQ(pc[s], schedules[s].size()) << "p " << p << " m " << m << " stage " << s;
    }
  }
}

TEST(PipeSchedule, BubbleFractionIsDeepSpeeds) {
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 4), 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(4, 16), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(1, 8), 0.0);
  EXPECT_THROW(train_schedule(2, 2, 4), std::invalid_argument);
  EXPECT_THROW(train_schedule(2, 0, 0), std::invalid_argument);
}

TEST(PipePartition, UniformGivesTheFirstStagesTheRemainder) {
  EXPECT_EQ(partition_uniform(10, 4), (std::vector<int>{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_uniform(4, 4), (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(PipePartition, ParametersMinimiseTheLargestStage) {
  // An embedding of 10, four blocks of 3, a head of 10: the best largest stage over 3 stages is 12 (the blocks together).
  const std::vector<LayerInfo> gpt = {{"Embedding", 10}, {"Block", 3}, {"Block", 3}, {"Block", 3},
                                      {"Block", 3},      {"Head", 10}};
  EXPECT_EQ(partition_layers(gpt, 3, "parameters"), (std::vector<int>{0, 1, 5, 6}));
  EXPECT_EQ(partition_layers(gpt, 2, "parameters"), (std::vector<int>{0, 3, 6}));
  EXPECT_EQ(partition_balanced({1, 1, 1, 1}, 2), (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(partition_balanced({5, 1, 1, 1, 1, 1}, 2), (std::vector<int>{0, 1, 6}));
}

TEST(PipePartition, TypeBalancesTheMatchingLayers) {
  const std::vector<LayerInfo> gpt = {{"Embedding", 100}, {"Block", 3}, {"Block", 3}, {"Block", 3},
                                      {"Block", 3},       {"Head", 100}};
  const auto parts = partition_layers(gpt, 2, "type:block");  // case-insensitive, as DeepSpeed's
  int first = 0, second = 0;
  for (int l = 0; l < 6; ++l) (l < parts[1] ? first : second) += gpt[l].type == "Block" ? 1 : 0;
  EXPECT_EQ(first, 2);
  EXPECT_EQ(second, 2);
}

TEST(PipePartition, ErrorsNameTheNumbersAndTheRule) {
  const std::vector<LayerInfo> three = {{"Embedding", 1}, {"Block", 1}, {"Head", 1}};
  auto message = [&](int stages, const std::string& method) {
    try {
      partition_layers(three, stages, method);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(4, "parameters"),
            "pipeline: 4 stages but the model has 3 layers: every stage needs at least one layer");
  EXPECT_EQ(message(4, "uniform"), "pipeline: 4 stages but the model has 3 layers: every stage needs at least one layer");
  EXPECT_EQ(message(2, "best"), "pipeline partition method 'best' is not one of: parameters, uniform, type:REGEX");
  EXPECT_EQ(message(2, "type:Attention"),
            "pipeline partition method 'type:Attention' matches none of the layer types ('Embedding', 'Block', "
            "'Head')");
  EXPECT_NE(message(2, "type:(").find("is not a regular expression"), std::string::npos);
}

}  // namespace
}  // namespace dscpp::testing
