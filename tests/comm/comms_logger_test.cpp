// comms_logger: bus bandwidth as NCCL's tests define it, the summary's rows, prof_ops filtering, and on 2 real
// processes the exact number and size of the collectives gpt-train's steps issue at ZeRO stages 0, 1 and 2.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../common/multiprocess.h"
#include "dscpp/comm/comms_logger.h"
#include "dscpp/config/config.h"

namespace dscpp::testing {
namespace {

TEST(CommsLogger, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor("all_reduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor("all_gather", 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor("reduce_scatter", 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_factor("broadcast", 8), 1.0);
  EXPECT_DOUBLE_EQ(bus_factor("all_reduce", 1), 0.0);
}

TEST(CommsLogger, GroupsByOpAndSizeWithBandwidths) {
  CommsLoggerConfig config;
  config.enabled = true;
  std::vector<std::string> lines;
  CommsLogger logger(config, 0, 4, [&](const std::string& line) { lines.push_back(line); });
  logger.record("all_reduce", 1'000'000, 0.001);
  logger.record("all_reduce", 1'000'000, 0.003);
  logger.record("all_reduce", 16, 0.0001);
  const auto stats = logger.stats();
  const auto& big = stats.at("all_reduce").at(1'000'000);
  EXPECT_EQ(big.count, 2);
  EXPECT_EQ(big.bytes, 2'000'000);
  EXPECT_DOUBLE_EQ(big.min_s, 0.001);
  EXPECT_DOUBLE_EQ(big.max_s, 0.003);
  EXPECT_DOUBLE_EQ(big.algbw_sum, 1e9 + 1e9 / 3);
  EXPECT_DOUBLE_EQ(big.busbw_sum, 1.5 * (1e9 + 1e9 / 3));
  EXPECT_EQ(stats.at("all_reduce").at(16).count, 1);
  EXPECT_TRUE(lines.empty()) << "not verbose: nothing per op";
  const auto summary = logger.summary();
  EXPECT_NE(summary.find("busbw"), std::string::npos) << summary;
  EXPECT_NE(summary.find("976.56 KB"), std::string::npos) << summary;  // 1e6 bytes

  config.verbose = true;
  config.prof_all = false;
  config.prof_ops = {"all_gather"};
  CommsLogger only_gathers(config, 0, 2, [&](const std::string& line) { lines.push_back(line); });
  EXPECT_TRUE(only_gathers.wants("all_gather"));
  EXPECT_FALSE(only_gathers.wants("all_reduce"));
  only_gathers.record("all_gather", 2048, 0.5);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("all_gather | 2.00 KB | 500.000 ms"), std::string::npos) << lines[0];
}

// A comm split from a logged one is logged too, its ops under the group's size ("all_gather[1]") with the bus factor
// of that size, so a summary tells the data group's traffic from a sub-group's (ZeRO++'s hpZ groups).
TEST(CommsLogger, SubGroupOpsAreNamedWithTheGroupSize) {
  CommsLoggerConfig config;
  config.enabled = true;
  auto logger = std::make_shared<CommsLogger>(config, 0, 4, [](const std::string&) {});
  logger->record("all_gather[2]", 1'000'000, 0.001);
  EXPECT_DOUBLE_EQ(logger->stats().at("all_gather[2]").at(1'000'000).busbw_sum, 0.5 * 1e9);  // (2 - 1) / 2

  auto logged = make_logged_comm(make_single_process_comm(), logger);
  auto group = logged->split(0, 0);
  auto out = torch::zeros({4});
  group->all_gather(out, torch::ones({4})).wait();
  logged->all_gather(out, torch::ones({4})).wait();
  const auto stats = logger->stats();
  EXPECT_EQ(stats.at("all_gather[1]").at(16).count, 1);
  EXPECT_EQ(stats.at("all_gather").at(16).count, 1);
}

// op → message bytes → count, from rank 0's summary.
std::map<std::string, std::map<std::string, int>> summary_counts(const std::string& log) {
  std::map<std::string, std::map<std::string, int>> counts;
  std::istringstream in(log.substr(log.find("[comms] summary")));
  std::string line;
  std::getline(in, line);  // title
  std::getline(in, line);  // header
  while (std::getline(in, line) && !line.empty() && line[0] != '[') {
    std::istringstream row(line);
    std::string op, number, unit;
    int count = 0;
    row >> op >> number >> unit >> count;
    counts[op][number + " " + unit] = count;
  }
  return counts;
}

class CommsLoggerSteps : public ::testing::TestWithParam<int> {};

TEST_P(CommsLoggerSteps, CountsAreTheStagesKnownCollectives) {
  const int stage = GetParam();
  const auto dir = temp_dir("comms_logger_s" + std::to_string(stage));
  // One communication group (buckets larger than the model), 3 steps of 2 micro-steps on 2 ranks.
  const nlohmann::json config = {
      {"train_batch_size", 8},
      {"gradient_accumulation_steps", 2},
      {"steps_per_print", 100},
      {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 500'000'000}, {"allgather_bucket_size", 500'000'000}}},
      {"comms_logger", {{"enabled", true}}},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  std::ofstream(dir / "config.json") << config.dump();
  const auto ranks = run_ranks(2,
                               std::string(DSCPP_BINARY_DIR) + "/gpt-train --no_progress --model tiny --seq_len 32 "
                               "--steps 3 --deepspeed_config " + (dir / "config.json").string(),
                               "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=30");
  for (int r = 0; r < 2; ++r) ASSERT_EQ(ranks[r].code, 0) << "rank " << r << ":\n" << ranks[r].err;
  ASSERT_NE(ranks[0].err.find("[comms] summary"), std::string::npos) << ranks[0].err;
  auto counts = summary_counts(ranks[0].err);
  // Initialize broadcasts rank 0's flat parameters once; that message is the model's size.
  ASSERT_EQ(counts["broadcast"].size(), 1u) << ranks[0].err;
  const std::string model = counts["broadcast"].begin()->first;
  EXPECT_EQ(counts["broadcast"][model], 1);
  // Every step: one all-reduce of (‖g‖², loss sum) as two doubles.
  EXPECT_EQ(counts["all_reduce"]["16 B"], 3) << ranks[0].err;
  switch (stage) {
    case 0:  // gradients all-reduced once per step, at the boundary
      EXPECT_EQ(counts["all_reduce"][model], 3) << ranks[0].err;
      EXPECT_EQ(counts.count("reduce_scatter"), 0u);
      EXPECT_EQ(counts.count("all_gather"), 0u);
      break;
    case 1:  // reduce-scattered at the boundary, the updated partition all-gathered
      EXPECT_EQ(counts["reduce_scatter"][model], 3) << ranks[0].err;
      EXPECT_EQ(counts["all_gather"][model], 3) << ranks[0].err;
      break;
    case 2:  // reduce-scattered in every micro-step's backward
      EXPECT_EQ(counts["reduce_scatter"][model], 6) << ranks[0].err;
      EXPECT_EQ(counts["all_gather"][model], 3) << ranks[0].err;
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, CommsLoggerSteps, ::testing::Values(0, 1, 2),
                         [](const auto& info) { return "stage" + std::to_string(info.param); });

}  // namespace
}  // namespace dscpp::testing
