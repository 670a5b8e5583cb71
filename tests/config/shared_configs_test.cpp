// Every config in examples/configs (the ones the seed documents show) parses with the values a user would pass
// (HF-style: micro 4, grad_accum 2, lr 3e-4, weight_decay 0.01, warmup 10, total 100, hidden 768, clip 1.0, world 2).
#include <gtest/gtest.h>

#include <filesystem>

#include "config_test_util.h"

namespace dscpp {
namespace {

const std::string kDir = DSCPP_CONFIGS_DIR "/";

ConfigOptions user_options(bool fp16, std::vector<std::string>* warnings) {
  AutoValues::HfArgs a = testing::user_args();
  if (!fp16) {
    a.fp16.reset();
    a.bf16 = true;
  }
  ConfigOptions options;
  options.world_size = 2;
  options.auto_values = AutoValues::from_hf_args(a);
  options.warn = [warnings](const std::string& m) { warnings->push_back(m); };
  return options;
}

Config load(const std::string& name, bool fp16 = true) {
  std::vector<std::string> warnings;
  Config c = Config::from_file(kDir + name, user_options(fp16, &warnings));
  EXPECT_TRUE(warnings.empty()) << name << ": " << warnings.front();
  EXPECT_EQ(c.resolved.dump().find("\"auto\""), std::string::npos) << name;
  return c;
}

TEST(SharedConfigs, EveryFileParsesWithFp16AndWithBf16Flags) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kDir)) {
    if (entry.path().extension() != ".json") continue;
    ++count;
    for (bool fp16 : {true, false}) {
      std::vector<std::string> warnings;
      EXPECT_NO_THROW(Config::from_file(entry.path().string(), user_options(fp16, &warnings))) << entry.path();
    }
  }
  EXPECT_GE(count, 6);
}

TEST(SharedConfigs, Zero2Bf16_3090) {
  Config c = load("seed000_zero2_bf16_3090.json");
  EXPECT_TRUE(c.bf16);
  EXPECT_FALSE(c.fp16.enabled);  // fp16 absent: the --fp16 flag fills only "auto"
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_FALSE(c.zero.contiguous_gradients);
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000);
  EXPECT_EQ(c.zero.sub_group_size, 500'000);
  // Explicit batch numbers in the file win over the flags: 1 × 4 × 2.
  EXPECT_EQ(c.batch.train_batch_size, 8);
  EXPECT_EQ(c.batch.micro_batch, 1);
  EXPECT_EQ(c.batch.grad_accum, 4);
  EXPECT_EQ(c.gradient_clipping, 1.0);
}

TEST(SharedConfigs, Zero3OffloadOptimizer) {
  Config c = load("seed000_zero3_offload_optimizer.json");
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNone);
  EXPECT_EQ(c.batch.train_batch_size, 16);
  EXPECT_EQ(c.batch.micro_batch, 4);
  EXPECT_EQ(c.batch.grad_accum, 2);
  EXPECT_EQ(c.compute_dtype(), DType::kFloat32);
}

TEST(SharedConfigs, Zero2Fp16Auto) {
  Config c = load("seed001_zero2_fp16_auto.json");
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.scaler.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.scaler.hysteresis, 2);
  EXPECT_EQ(c.optimizer->type, "AdamW");
  const auto& adam = std::get<AdamOptions>(c.optimizer->options);
  EXPECT_EQ(adam.lr, 3e-4);
  EXPECT_EQ(adam.weight_decay, 0.01);
  EXPECT_TRUE(adam.torch_adam);
  EXPECT_EQ(c.scheduler->type, "WarmupDecayLR");
  const auto& s = std::get<WarmupDecayLROptions>(c.scheduler->options);
  EXPECT_EQ(s.warmup.warmup_min_lr, 0.0);
  EXPECT_EQ(s.warmup.warmup_max_lr, 3e-4);
  EXPECT_EQ(s.warmup.warmup_num_steps, 10);
  EXPECT_EQ(s.total_num_steps, 100);
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.allgather_bucket_size, 200'000'000);
  EXPECT_EQ(c.zero.reduce_bucket_size, 768 * 768);
  EXPECT_EQ(c.batch.train_batch_size, 16);
  EXPECT_EQ(c.batch.grad_accum, 2);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.steps_per_print, 1000);
}

TEST(SharedConfigs, Zero3Fp16Auto) {
  Config c = load("seed001_zero3_fp16_auto.json");
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_EQ(c.fp16.scaler.initial_scale_power, 32);
  const auto& adam = std::get<AdamOptions>(c.optimizer->options);
  EXPECT_EQ(adam.betas[1], 0.999);
  EXPECT_EQ(adam.eps, 1e-8);
  EXPECT_EQ(adam.lr, 3e-4);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 530'841);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 7'680);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 0);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 0);
  EXPECT_TRUE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.batch.train_batch_size, 16);
  EXPECT_EQ(c.batch.micro_batch, 4);
  EXPECT_EQ(c.batch.grad_accum, 2);
  EXPECT_FALSE(c.scheduler.has_value());
}

TEST(SharedConfigs, Zero2OffloadAuto) {
  Config c = load("seed002_zero2_offload_auto.json");
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16);
  const auto& adam = std::get<AdamOptions>(c.optimizer->options);
  EXPECT_EQ(adam.betas[0], 0.9);
  EXPECT_EQ(adam.eps, 1e-8);
  EXPECT_EQ(adam.weight_decay, 0.01);
  EXPECT_EQ(c.scheduler->type, "WarmupLR");
  const auto& s = std::get<WarmupLROptions>(c.scheduler->options);
  EXPECT_EQ(s.warmup_max_lr, 3e-4);
  EXPECT_EQ(s.warmup_num_steps, 10);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.reduce_bucket_size, 200'000'000);
  EXPECT_EQ(c.steps_per_print, 20);
  Config bf16 = load("seed002_zero2_offload_auto.json", /*fp16=*/false);
  EXPECT_TRUE(bf16.bf16);
  EXPECT_FALSE(bf16.fp16.enabled);
}

TEST(SharedConfigs, Zero3OffloadAuto) {
  Config c = load("seed002_zero3_offload_auto.json");
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kCpu);
  EXPECT_TRUE(c.zero.offload_param.pin_memory);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000);
  EXPECT_EQ(c.zero.reduce_bucket_size, 589'824);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 530'841);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 7'680);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1'000'000'000);
  EXPECT_EQ(c.batch.train_batch_size, 16);
}

}  // namespace
}  // namespace dscpp
