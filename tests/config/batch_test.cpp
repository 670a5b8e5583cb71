// The batch triangle: every combination of given sides and every error, with all four numbers printed.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "dscpp/config/batch.h"

namespace dscpp {
namespace {

std::string batch_error(std::optional<int64_t> t, std::optional<int64_t> m, std::optional<int64_t> g, int w) {
  try {
    resolve_batch(t, m, g, w);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

void expect_batch(BatchConfig b, int64_t t, int64_t m, int64_t g) {
  EXPECT_EQ(b.train_batch_size, t);
  EXPECT_EQ(b.micro_batch, m);
  EXPECT_EQ(b.grad_accum, g);
}

TEST(BatchTriangle, EveryCombinationOfGivenSides) {
  expect_batch(resolve_batch(32, 4, 2, 4), 32, 4, 2);
  expect_batch(resolve_batch(32, 4, std::nullopt, 4), 32, 4, 2);
  expect_batch(resolve_batch(32, std::nullopt, 2, 4), 32, 4, 2);
  expect_batch(resolve_batch(std::nullopt, 4, 2, 4), 32, 4, 2);
  expect_batch(resolve_batch(32, std::nullopt, std::nullopt, 4), 32, 8, 1);
  expect_batch(resolve_batch(std::nullopt, 4, std::nullopt, 4), 16, 4, 1);
  expect_batch(resolve_batch(std::nullopt, 3, std::nullopt, 1), 3, 3, 1);
}

TEST(BatchTriangle, InconsistentPrintsAllFourNumbers) {
  std::string e = batch_error(32, 4, 2, 2);
  EXPECT_CONTAINS(e, "train_batch_size=32");
  EXPECT_CONTAINS(e, "train_micro_batch_size_per_gpu=4");
  EXPECT_CONTAINS(e, "gradient_accumulation_steps=2");
  EXPECT_CONTAINS(e, "world_size=2");
  EXPECT_CONTAINS(e, "= 16");
}

TEST(BatchTriangle, NotDivisible) {
  std::string e = batch_error(30, 4, std::nullopt, 2);
  EXPECT_CONTAINS(e, "divisible by train_micro_batch_size_per_gpu × world_size = 8");
  EXPECT_CONTAINS(e, "train_batch_size=30");
  EXPECT_CONTAINS(e, "gradient_accumulation_steps=unset");
  EXPECT_CONTAINS(batch_error(30, std::nullopt, 4, 2), "divisible by gradient_accumulation_steps × world_size = 8");
  EXPECT_CONTAINS(batch_error(7, std::nullopt, std::nullopt, 2), "divisible by world_size");
}

TEST(BatchTriangle, NonPositiveAndMissing) {
  EXPECT_CONTAINS(batch_error(0, std::nullopt, std::nullopt, 1), "train_batch_size must be > 0");
  EXPECT_CONTAINS(batch_error(std::nullopt, -2, std::nullopt, 1), "train_micro_batch_size_per_gpu must be > 0");
  EXPECT_CONTAINS(batch_error(8, 2, 0, 1), "gradient_accumulation_steps must be > 0");
  EXPECT_CONTAINS(batch_error(8, 2, 4, 0), "world_size must be >= 1");
  std::string none = batch_error(std::nullopt, std::nullopt, std::nullopt, 2);
  EXPECT_CONTAINS(none, "set train_batch_size or train_micro_batch_size_per_gpu");
  EXPECT_CONTAINS(none, "world_size=2");
  EXPECT_CONTAINS(batch_error(std::nullopt, std::nullopt, 4, 2), "set train_batch_size or");
}

TEST(BatchTriangle, ThroughTheConfig) {
  ConfigOptions options;
  options.world_size = 4;
  Config c = testing::parse({{"train_batch_size", 64}, {"gradient_accumulation_steps", 2}}, options);
  expect_batch(c.batch, 64, 8, 2);
  EXPECT_EQ(c.resolved["train_micro_batch_size_per_gpu"], 8);
  std::string e = testing::error_of({{"train_batch_size", 64}, {"train_micro_batch_size_per_gpu", 8},
                                     {"gradient_accumulation_steps", 4}}, options);
  EXPECT_CONTAINS(e, "train_batch_size=64, train_micro_batch_size_per_gpu=8, gradient_accumulation_steps=4, "
                     "world_size=4");
}

}  // namespace
}  // namespace dscpp
