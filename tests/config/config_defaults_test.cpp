// Every key's default, in the typed Config and written out in Config::resolved.
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace dscpp {
namespace {

using testing::parse;
using nlohmann::json;

const json kMinimal = {{"train_micro_batch_size_per_gpu", 1}};

TEST(ConfigDefaults, TopLevel) {
  Config c = parse(kMinimal);
  EXPECT_EQ(c.batch.train_batch_size, 1);
  EXPECT_EQ(c.batch.micro_batch, 1);
  EXPECT_EQ(c.batch.grad_accum, 1);
  EXPECT_EQ(c.gradient_clipping, 1.0);  // DeepSpeed 0.19.8's GRADIENT_CLIPPING_DEFAULT
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_FALSE(c.wall_clock_breakdown);
  EXPECT_FALSE(c.memory_breakdown);
  EXPECT_FALSE(c.prescale_gradients);
  EXPECT_EQ(c.gradient_predivide_factor, 1.0);
  EXPECT_FALSE(c.communication_data_type.has_value());
  EXPECT_FALSE(c.optimizer.has_value());
  EXPECT_FALSE(c.scheduler.has_value());
  EXPECT_EQ(c.compute_dtype(), DType::kFloat32);
}

TEST(ConfigDefaults, Precision) {
  Config c = parse(kMinimal);
  EXPECT_FALSE(c.fp16.enabled);
  EXPECT_FALSE(c.fp16.auto_cast);
  EXPECT_EQ(c.fp16.scaler.static_scale, 0.0);
  EXPECT_EQ(c.fp16.scaler.initial_scale_power, 16);
  EXPECT_EQ(c.fp16.scaler.scale_window, 1000);
  EXPECT_EQ(c.fp16.scaler.hysteresis, 2);
  EXPECT_FALSE(c.fp16.scaler.consecutive_hysteresis);
  EXPECT_EQ(c.fp16.scaler.min_scale, 1.0);
  EXPECT_FALSE(c.bf16);
}

TEST(ConfigDefaults, Zero) {
  Config c = parse(kMinimal);
  const ZeroConfig& z = c.zero;
  EXPECT_EQ(z.stage, 0);
  EXPECT_TRUE(z.contiguous_gradients);
  EXPECT_TRUE(z.reduce_scatter);
  EXPECT_EQ(z.reduce_bucket_size, 500'000'000);
  EXPECT_TRUE(z.allgather_partitions);
  EXPECT_EQ(z.allgather_bucket_size, 500'000'000);
  EXPECT_FALSE(z.overlap_comm);
  EXPECT_EQ(z.sub_group_size, 1'000'000'000);
  EXPECT_EQ(z.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(z.stage3_param_persistence_threshold, 100'000);
  EXPECT_EQ(z.stage3_max_live_parameters, 1'000'000'000);
  EXPECT_EQ(z.stage3_max_reuse_distance, 1'000'000'000);
  EXPECT_FALSE(z.stage3_gather_16bit_weights_on_model_save);
  EXPECT_FALSE(z.round_robin_gradients);
  EXPECT_EQ(z.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(z.offload_optimizer.nvme_path, "");
  EXPECT_FALSE(z.offload_optimizer.pin_memory);
  EXPECT_EQ(z.offload_optimizer.buffer_count, 4);
  EXPECT_EQ(z.offload_optimizer.ratio, 1.0);
  EXPECT_EQ(z.offload_param.device, OffloadDevice::kNone);
  EXPECT_FALSE(z.offload_param.pin_memory);
  EXPECT_EQ(z.offload_param.buffer_count, 5);
  EXPECT_EQ(z.offload_param.buffer_size, 100'000'000);
  EXPECT_EQ(z.offload_param.max_in_cpu, 1'000'000'000);
}

TEST(ConfigDefaults, OverlapCommDependsOnStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    Config c = parse({{"train_batch_size", 8}, {"zero_optimization", {{"stage", stage}}}});
    EXPECT_EQ(c.zero.overlap_comm, stage == 3) << "stage " << stage;
    EXPECT_EQ(c.resolved["zero_optimization"]["overlap_comm"], stage == 3);
  }
  Config explicit_off =
      parse({{"train_batch_size", 8}, {"zero_optimization", {{"stage", 3}, {"overlap_comm", false}}}});
  EXPECT_FALSE(explicit_off.zero.overlap_comm);
}

TEST(ConfigDefaults, AioCheckpointingMonitors) {
  Config c = parse(kMinimal);
  EXPECT_EQ(c.aio.block_size, 1'048'576);
  EXPECT_EQ(c.aio.queue_depth, 8);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1);
  EXPECT_FALSE(c.aio.single_submit);
  EXPECT_TRUE(c.aio.overlap_events);
  EXPECT_FALSE(c.activation_checkpointing.partition_activations);
  EXPECT_FALSE(c.activation_checkpointing.cpu_checkpointing);
  EXPECT_FALSE(c.activation_checkpointing.contiguous_memory_optimization);
  EXPECT_FALSE(c.activation_checkpointing.number_checkpoints.has_value());
  EXPECT_FALSE(c.activation_checkpointing.synchronize_checkpoint_boundary);
  EXPECT_FALSE(c.activation_checkpointing.profile);
  for (const MonitorConfig* m : {&c.tensorboard, &c.csv_monitor, &c.wandb}) {
    EXPECT_FALSE(m->enabled);
    EXPECT_EQ(m->output_path, "");
    EXPECT_EQ(m->job_name, "DeepSpeedJobName");
  }
  EXPECT_FALSE(c.flops_profiler.enabled);
  EXPECT_EQ(c.flops_profiler.profile_step, 1);
  EXPECT_EQ(c.flops_profiler.module_depth, -1);
  EXPECT_EQ(c.flops_profiler.top_modules, 1);
  EXPECT_TRUE(c.flops_profiler.detailed);
  EXPECT_FALSE(c.comms_logger.enabled);
  EXPECT_TRUE(c.comms_logger.prof_all);
  EXPECT_EQ(c.checkpoint.tag_validation, "Warn");
  EXPECT_FALSE(c.checkpoint.load_universal);
}

TEST(ConfigDefaults, OptimizerParamsPerType) {
  auto optimizer = [](const std::string& type) {
    return parse({{"train_batch_size", 1}, {"optimizer", {{"type", type}}}}).optimizer.value();
  };
  OptimizerConfig adam = optimizer("adam");  // case-insensitive
  EXPECT_EQ(adam.type, "Adam");
  const auto& a = std::get<AdamOptions>(adam.options);
  EXPECT_EQ(a.lr, 1e-3);
  EXPECT_EQ(a.betas[0], 0.9);
  EXPECT_EQ(a.betas[1], 0.999);
  EXPECT_EQ(a.eps, 1e-8);
  EXPECT_EQ(a.weight_decay, 0.0);
  EXPECT_TRUE(a.adam_w_mode);
  EXPECT_TRUE(a.bias_correction);
  EXPECT_FALSE(a.torch_adam);
  EXPECT_EQ(optimizer("ADAMW").type, "AdamW");
  // Copies: a reference into a temporary config would dangle (ASan: stack-use-after-scope).
  const auto s = std::get<SgdOptions>(optimizer("sgd").options);
  EXPECT_EQ(s.momentum, 0.0);
  EXPECT_FALSE(s.nesterov);
  const auto l = std::get<LionOptions>(optimizer("lion").options);
  EXPECT_EQ(l.lr, 1e-4);
  EXPECT_EQ(l.betas[1], 0.99);
  const auto g = std::get<AdagradOptions>(optimizer("Adagrad").options);
  EXPECT_EQ(g.lr, 1e-2);
  EXPECT_EQ(g.eps, 1e-10);
  const auto lamb = std::get<LambOptions>(optimizer("Lamb").options);
  EXPECT_EQ(lamb.lr, 1e-3);
  EXPECT_EQ(lamb.max_coeff, 10.0);
  EXPECT_EQ(lamb.min_coeff, 0.01);
  EXPECT_TRUE(lamb.bias_correction);
  EXPECT_FALSE(lamb.eps_inside_sqrt);
  const auto onebit_lamb = std::get<OneBitLambOptions>(optimizer("OneBitLamb").options);
  EXPECT_EQ(onebit_lamb.freeze_step, 100000);
  EXPECT_EQ(onebit_lamb.coeff_beta, 0.9);
  EXPECT_EQ(onebit_lamb.factor_max, 4.0);
  EXPECT_EQ(onebit_lamb.factor_min, 0.5);
  EXPECT_EQ(onebit_lamb.factor_threshold, 0.1);
  // DeepSpeed asserts dynamic loss scaling for both.
  EXPECT_NE(testing::error_of({{"train_batch_size", 1}, {"fp16", {{"enabled", true}, {"loss_scale", 128}}},
                               {"optimizer", {{"type", "Lamb"}}}})
                .find("requires dynamic loss scaling"),
            std::string::npos);
}

TEST(ConfigDefaults, SchedulerParamsPerType) {
  auto scheduler = [](const json& s) { return parse({{"train_batch_size", 1}, {"scheduler", s}}).scheduler.value(); };
  const auto w = std::get<WarmupLROptions>(scheduler({{"type", "WarmupLR"}}).options);
  EXPECT_EQ(w.warmup_min_lr, 0.0);
  EXPECT_FALSE(w.warmup_max_lr.has_value());  // WarmupLR warms up to the optimizer's lr
  EXPECT_EQ(w.warmup_num_steps, 1000);
  EXPECT_EQ(w.warmup_type, WarmupType::kLog);
  const auto d = std::get<WarmupDecayLROptions>(
      scheduler({{"type", "WarmupDecayLR"}, {"params", {{"total_num_steps", 5000}, {"warmup_type", "linear"}}}})
          .options);
  EXPECT_EQ(d.total_num_steps, 5000);
  EXPECT_EQ(d.warmup.warmup_max_lr, 1e-3);  // WarmupDecayLR's own default
  EXPECT_EQ(d.warmup.warmup_type, WarmupType::kLinear);
  const auto cos = std::get<WarmupCosineLROptions>(
      scheduler({{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 2000}}}}).options);
  EXPECT_EQ(cos.warmup_min_ratio, 0.0);
  EXPECT_EQ(cos.cos_min_ratio, 1e-4);
  EXPECT_EQ(cos.warmup_num_steps, 1000);
  const auto one = std::get<OneCycleOptions>(
      scheduler({{"type", "OneCycle"}, {"params", {{"cycle_min_lr", 1e-4}, {"cycle_max_lr", 1e-3}}}}).options);
  EXPECT_EQ(one.cycle_first_step_size, 2000);
  EXPECT_EQ(one.cycle_second_step_size, -1);
  EXPECT_EQ(one.cycle_second_stair_count, -1);
  EXPECT_TRUE(one.cycle_momentum);
  EXPECT_EQ(one.cycle_min_mom, 0.8);
  EXPECT_EQ(one.cycle_max_mom, 0.9);
  const auto range = std::get<LRRangeTestOptions>(scheduler({{"type", "LRRangeTest"}}).options);
  EXPECT_EQ(range.lr_range_test_min_lr, 1e-3);
  EXPECT_EQ(range.lr_range_test_step_size, 2000);
  EXPECT_EQ(range.lr_range_test_step_rate, 1.0);
  EXPECT_FALSE(range.lr_range_test_staircase);
}

TEST(ConfigDefaults, ResolvedWritesEveryDefault) {
  Config c = parse(kMinimal);
  const json& r = c.resolved;
  EXPECT_EQ(r["train_batch_size"], 1);
  EXPECT_EQ(r["gradient_accumulation_steps"], 1);
  EXPECT_EQ(r["steps_per_print"], 10);
  EXPECT_TRUE(r["communication_data_type"].is_null());
  EXPECT_EQ(r["fp16"]["initial_scale_power"], 16);
  EXPECT_EQ(r["fp16"]["loss_scale_window"], 1000);
  EXPECT_EQ(r["bf16"]["enabled"], false);
  EXPECT_EQ(r["zero_optimization"]["reduce_bucket_size"], 500000000);
  EXPECT_EQ(r["zero_optimization"]["offload_optimizer"]["device"], "none");
  EXPECT_EQ(r["zero_optimization"]["offload_param"]["buffer_size"], 100000000);
  EXPECT_EQ(r["aio"]["block_size"], 1048576);
  EXPECT_EQ(r["checkpoint"]["tag_validation"], "Warn");
  EXPECT_FALSE(r.contains("optimizer"));
  // Round trip: the resolved document parses to the same values, with no warnings.
  std::vector<std::string> warnings;
  Config again = parse(r, {}, &warnings);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_EQ(again.resolved, r);
}

TEST(ConfigDefaults, ScientificNumbersAndAliases) {
  Config c = parse({{"train_batch_size", 1},
                    {"zero_optimization", {{"stage", 2}, {"reduce_bucket_size", 5e5}, {"allgather_bucket_size", 2e8}}},
                    {"bfloat16", {{"enabled", true}}},
                    {"communication_data_type", "float16"}});
  EXPECT_EQ(c.zero.reduce_bucket_size, 500'000);
  EXPECT_EQ(c.zero.allgather_bucket_size, 200'000'000);
  EXPECT_TRUE(c.resolved["zero_optimization"]["reduce_bucket_size"].is_number_integer());
  EXPECT_EQ(c.resolved["zero_optimization"]["reduce_bucket_size"], 500000);
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.compute_dtype(), DType::kBFloat16);
  EXPECT_FALSE(c.resolved.contains("bfloat16"));
  EXPECT_EQ(c.resolved["bf16"]["enabled"], true);
  EXPECT_EQ(c.communication_data_type, DType::kFloat16);
  for (const auto& [name, dtype] : std::vector<std::pair<std::string, DType>>{
           {"fp32", DType::kFloat32}, {"float32", DType::kFloat32}, {"fp16", DType::kFloat16},
           {"bf16", DType::kBFloat16}, {"bfloat16", DType::kBFloat16}}) {
    EXPECT_EQ(parse({{"train_batch_size", 1}, {"communication_data_type", name}}).communication_data_type, dtype)
        << name;
  }
}

TEST(ConfigDefaults, OverridesApplyBeforeParsing) {
  ConfigOptions options;
  options.overrides["zero_optimization.stage"] = 3;
  options.overrides["optimizer.type"] = "SGD";
  options.overrides["optimizer.params.momentum"] = 0.9;
  Config c = parse({{"train_batch_size", 4}, {"zero_optimization", {{"stage", 1}}}}, options);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.optimizer->type, "SGD");
  EXPECT_EQ(std::get<SgdOptions>(c.optimizer->options).momentum, 0.9);
}

TEST(ConfigDefaults, LegacyCpuOffloadMapsToOffloadOptimizer) {
  Config c = parse({{"train_batch_size", 1}, {"zero_optimization", {{"stage", 2}, {"cpu_offload", true}}}});
  EXPECT_EQ(c.zero.offload_optimizer.device, OffloadDevice::kCpu);
  EXPECT_EQ(c.resolved["zero_optimization"]["offload_optimizer"]["device"], "cpu");
}

}  // namespace
}  // namespace dscpp
