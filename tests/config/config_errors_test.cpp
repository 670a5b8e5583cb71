// Every ConfigError names the key path, the value found and what is allowed.
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dscpp {
namespace {

using nlohmann::json;
using testing::error_of;

json with(json extra) {
  json base = {{"train_batch_size", 8}};
  base.update(extra);
  return base;
}

TEST(ConfigErrors, Fp16AndBf16BothEnabled) {
  std::string e = error_of(with({{"fp16", {{"enabled", true}}}, {"bf16", {{"enabled", true}}}}));
  EXPECT_CONTAINS(e, "fp16.enabled = true");
  EXPECT_CONTAINS(e, "bf16.enabled = true");
  EXPECT_CONTAINS(e, "at most one");
  // Through the alias too.
  EXPECT_CONTAINS(error_of(with({{"fp16", {{"enabled", true}}}, {"bfloat16", {{"enabled", true}}}})), "at most one");
  EXPECT_CONTAINS(error_of(with({{"bf16", {{"enabled", true}}}, {"bfloat16", {{"enabled", true}}}})), "alias");
}

TEST(ConfigErrors, OffloadParamBelowStage3) {
  std::string e = error_of(
      with({{"zero_optimization", {{"stage", 2}, {"offload_param", {{"device", "cpu"}}}}}}));
  EXPECT_CONTAINS(e, "zero_optimization.offload_param.device = \"cpu\"");
  EXPECT_CONTAINS(e, "stage 3");
  EXPECT_CONTAINS(e, "got stage 2");
}

TEST(ConfigErrors, StageOutOfRange) {
  std::string e = error_of(with({{"zero_optimization", {{"stage", 4}}}}));
  EXPECT_CONTAINS(e, "zero_optimization.stage = 4");
  EXPECT_CONTAINS(e, "0..3");
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", {{"stage", -1}}}})), "zero_optimization.stage = -1");
}

TEST(ConfigErrors, OffloadDevice) {
  std::string e = error_of(with({{"zero_optimization", {{"stage", 2}, {"offload_optimizer", {{"device", "gpu"}}}}}}));
  EXPECT_CONTAINS(e, "zero_optimization.offload_optimizer.device = \"gpu\"");
  EXPECT_CONTAINS(e, "none|cpu|nvme");
  std::string nvme = error_of(with({{"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "nvme"}}}}}}));
  EXPECT_CONTAINS(nvme, "zero_optimization.offload_param.nvme_path");
  EXPECT_CONTAINS(nvme, "\"nvme\"");
}

TEST(ConfigErrors, ScalerRanges) {
  EXPECT_CONTAINS(error_of(with({{"fp16", {{"hysteresis", 0}}}})), "fp16.hysteresis = 0: expected an integer in 1..");
  EXPECT_CONTAINS(error_of(with({{"fp16", {{"loss_scale_window", 0}}}})),
                  "fp16.loss_scale_window = 0: expected an integer >= 1");
  EXPECT_CONTAINS(error_of(with({{"fp16", {{"min_loss_scale", 0}}}})),
                  "fp16.min_loss_scale = 0: expected a number > 0");
  EXPECT_CONTAINS(error_of(with({{"fp16", {{"min_loss_scale", -1.5}}}})), "fp16.min_loss_scale = -1.5");
  EXPECT_CONTAINS(error_of(with({{"fp16", {{"loss_scale", -1}}}})), "fp16.loss_scale = -1");
}

TEST(ConfigErrors, TopLevelRanges) {
  EXPECT_CONTAINS(error_of(with({{"gradient_clipping", -1.0}})), "gradient_clipping = -1.0: expected a number >= 0");
  EXPECT_CONTAINS(error_of(with({{"steps_per_print", 0}})), "steps_per_print = 0: expected an integer >= 1");
}

TEST(ConfigErrors, WrongTypes) {
  EXPECT_CONTAINS(error_of(with({{"steps_per_print", 5.5}})), "steps_per_print = 5.5: expected an integer");
  EXPECT_CONTAINS(error_of(with({{"steps_per_print", "10"}})), "steps_per_print = \"10\": expected an integer");
  EXPECT_CONTAINS(error_of(with({{"wall_clock_breakdown", 1}})), "wall_clock_breakdown = 1: expected true or false");
  EXPECT_CONTAINS(error_of(with({{"gradient_clipping", "1.0"}})), "gradient_clipping = \"1.0\": expected a number");
  EXPECT_CONTAINS(error_of(with({{"zero_optimization", 2}})), "zero_optimization = 2: expected an object");
  EXPECT_CONTAINS(error_of(with({{"optimizer", {{"type", "Adam"}, {"params", {{"betas", {0.9}}}}}}})),
                  "optimizer.params.betas = [0.9]: expected an array of two numbers");
  EXPECT_CONTAINS(error_of(json::array()), "expected a JSON object");
}

TEST(ConfigErrors, UnknownOptimizerAndScheduler) {
  std::string o = error_of(with({{"optimizer", {{"type", "RMSprop"}}}}));
  EXPECT_CONTAINS(o, "optimizer.type = \"RMSprop\"");
  EXPECT_CONTAINS(o, "Adam|AdamW|SGD|Lion|Adagrad|Lamb");
  std::string s = error_of(with({{"scheduler", {{"type", "Cosine"}}}}));
  EXPECT_CONTAINS(s, "scheduler.type = \"Cosine\"");
  EXPECT_CONTAINS(s, "WarmupLR|WarmupDecayLR|WarmupCosineLR|OneCycle|LRRangeTest");
  EXPECT_CONTAINS(error_of(with({{"optimizer", {{"params", {{"lr", 1}}}}}})), "optimizer.type = (absent)");
}

TEST(ConfigErrors, SchedulerStepsAndWarmupType) {
  std::string e = error_of(with({{"scheduler",
                                  {{"type", "WarmupDecayLR"},
                                   {"params", {{"warmup_num_steps", 100}, {"total_num_steps", 50}}}}}}));
  EXPECT_CONTAINS(e, "scheduler.params.total_num_steps = 50");
  EXPECT_CONTAINS(e, "warmup_num_steps (100)");
  EXPECT_CONTAINS(error_of(with({{"scheduler", {{"type", "WarmupCosineLR"}, {"params", json::object()}}}})),
                  "scheduler.params.total_num_steps = (absent)");
  std::string w = error_of(with({{"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_type", "cosine"}}}}}}));
  EXPECT_CONTAINS(w, "scheduler.params.warmup_type = \"cosine\"");
  EXPECT_CONTAINS(w, "log|linear");
  EXPECT_CONTAINS(error_of(with({{"scheduler", {{"type", "OneCycle"}}}})), "scheduler.params.cycle_min_lr");
}

TEST(ConfigErrors, CommunicationDataType) {
  std::string e = error_of(with({{"communication_data_type", "int8"}}));
  EXPECT_CONTAINS(e, "communication_data_type = \"int8\"");
  EXPECT_CONTAINS(e, "fp32|float32|fp16|float16|bf16|bfloat16");
}

TEST(ConfigErrors, OptimizerParamRanges) {
  EXPECT_CONTAINS(error_of(with({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", -0.1}}}}}})),
                  "optimizer.params.lr = -0.1: expected a number >= 0");
  EXPECT_CONTAINS(error_of(with({{"optimizer", {{"type", "AdamW"}, {"params", {{"adam_w_mode", false}}}}}})),
                  "optimizer.params.adam_w_mode = false");
  EXPECT_CONTAINS(error_of(with({{"optimizer", {{"type", "SGD"}, {"params", {{"nesterov", true}}}}}})),
                  "optimizer.params.nesterov = true");
  EXPECT_CONTAINS(error_of(with({{"optimizer", {{"type", "Adam"}, {"params", {{"betas", {0.9, 1.5}}}}}}})),
                  "optimizer.params.betas = [0.9,1.5]");
}

TEST(ConfigErrors, FromStringAndFile) {
  try {
    Config::from_string("{ not json");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_CONTAINS(e.what(), "not valid JSON");
  }
  try {
    Config::from_file("/nonexistent/ds_config.json");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_CONTAINS(e.what(), "/nonexistent/ds_config.json");
  }
}

}  // namespace
// A number given as null is refused naming the key (DeepSpeed reads None and fails later, e.g. `None > 0.0`);
// absent is what takes the default.
TEST(ConfigErrors, NullNumbersAreRefused) {
  EXPECT_CONTAINS(error_of({{"train_batch_size", 2}, {"gradient_clipping", nullptr}}),
                  "gradient_clipping = null: expected a number");
  EXPECT_CONTAINS(error_of({{"train_batch_size", 2}, {"zero_optimization", {{"stage", nullptr}}}}),
                  "zero_optimization.stage = null");
}

// Checks that used to wait for the engine are the config's, so `dscpp plan` refuses them too.
TEST(ConfigErrors, ChecksThatNeedNoMachine) {
  EXPECT_CONTAINS(error_of({{"train_batch_size", 2}, {"aio", {{"block_size", 1000}}}}),
                  "aio.block_size = 1000: expected a positive multiple of 4096");
  EXPECT_CONTAINS(error_of({{"train_batch_size", 2},
                            {"activation_checkpointing", {{"contiguous_memory_optimization", true}}}}),
                  "contiguous_memory_optimization = true needs activation_checkpointing.number_checkpoints");
  EXPECT_CONTAINS(error_of({{"train_batch_size", 2},
                            {"data_efficiency",
                             {{"enabled", false}, {"data_routing", {{"random_ltd", {{"enabled", true}}}}}}}}),
                  "data_efficiency.data_routing.random_ltd.enabled = true");
}

}  // namespace dscpp
