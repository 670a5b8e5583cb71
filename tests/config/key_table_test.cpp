// Every key of DeepSpeed's config reference (docs/_pages/config-json.md, and the keys its ZeRO/offload models
// accept), with what deepspeed.cpp does with it, asserted (issue 17):
//   acts      — the value reaches the typed Config (the row names the test that shows its effect on training);
//   harmless  — accepted; the row says why no value can change what this engine computes;
//   refused   — a value other than DeepSpeed's default stops the parse with "not supported yet", naming the key.
// A key missing from this table, or a parser that starts warning about one, fails the last test.
#include <gtest/gtest.h>

#include <fnmatch.h>

#include <algorithm>
#include <functional>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "../common/subprocess.h"
#include "config_test_util.h"

namespace dscpp::testing {
namespace {

enum class Kind { kActs, kHarmless, kRefused };

struct Row {
  std::string path;          // dotted key
  nlohmann::json value;      // a non-default value (acts, refused) or any value (harmless)
  Kind kind;
  // acts: a gtest pattern naming the test that shows the effect (KeyTable.NamedEffectTestsExist checks it matches a
  // registered test), or "untested: <where it acts>"; harmless: the reason; refused: the expected error text.
  std::string why;
  std::function<bool(const Config&)> took = {};  // acts: the value reached the typed config
  nlohmann::json context = nlohmann::json::object();  // other keys (dotted) the row needs, e.g. stage 3
};

const nlohmann::json kBase = {{"train_micro_batch_size_per_gpu", 2},
                              {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};

const nlohmann::json kStage3 = {{"zero_optimization.stage", 3}};
const nlohmann::json kStage2 = {{"zero_optimization.stage", 2}};
const nlohmann::json kNvmeOptimizer = {{"zero_optimization.stage", 2},
                                       {"zero_optimization.offload_optimizer.device", "nvme"},
                                       {"zero_optimization.offload_optimizer.nvme_path", "/tmp"}};
const nlohmann::json kNvmeParam = {{"zero_optimization.stage", 3},
                                   {"zero_optimization.offload_param.device", "nvme"},
                                   {"zero_optimization.offload_param.nvme_path", "/tmp"}};

std::vector<Row> table() {
  using K = Kind;
  return {
      // Batch size.
      {"train_batch_size", 8, K::kActs, "BatchTriangle.*", [](const Config& c) { return c.batch.train_batch_size == 8; }},
      {"train_micro_batch_size_per_gpu", 4, K::kActs, "GptTrain.AccumulationSplitGivesTheSameTrajectory",
       [](const Config& c) { return c.batch.micro_batch == 4; }},
      {"gradient_accumulation_steps", 3, K::kActs, "GptTrain.AccumulationSplitGivesTheSameTrajectory",
       [](const Config& c) { return c.batch.grad_accum == 3; }},
      // Optimizer and scheduler: the section parsers have their own tests (config_defaults_test, flat optimizers).
      {"optimizer.params.amsgrad", true, K::kActs, "FlatAdam.AmsgradMatchesTorchInBothModes",
       [](const Config& c) { return std::get<AdamOptions>(c.optimizer->options).amsgrad; }},
      {"optimizer.params.torch_adam", true, K::kHarmless,
       "torch.optim.Adam(W) instead of FusedAdam: the same update; ours is one flat Adam either way"},
      {"optimizer.params.adam_w_mode", false, K::kActs, "FlatAdam.L2ModeMatchesTorchAdam",
       [](const Config& c) { return !std::get<AdamOptions>(c.optimizer->options).adam_w_mode; },
       {{"optimizer.type", "Adam"}}},
      {"optimizer.params.fused", true, K::kHarmless, "a kernel choice of torch's; the same update"},
      {"optimizer.params.set_grad_none", true, K::kHarmless, "gradients are freed or zeroed the same way either way"},
      {"optimizer.legacy_fusion", true, K::kHarmless, "a kernel choice of DeepSpeed's fp16 optimizer"},
      {"optimizer.type", "Lamb", K::kActs, "FlatLamb.*",
       [](const Config& c) { return std::holds_alternative<LambOptions>(c.optimizer->options); }},
      {"scheduler.type", "WarmupLR", K::kActs, "WarmupLR.*", [](const Config& c) { return c.scheduler.has_value(); }},
      // Communication.
      {"communication_data_type", "fp32", K::kActs, "untested: make_stage_context passes it to every stage as the wire dtype",
       [](const Config& c) { return c.communication_data_type == DType::kFloat32; }},
      {"prescale_gradients", true, K::kActs, "untested: stage_context (assemble.cpp) divides before the reduction", [](const Config& c) { return c.prescale_gradients; }},
      {"gradient_predivide_factor", 2.0, K::kActs, "untested: stage_context (assemble.cpp) splits the averaging",
       [](const Config& c) { return c.gradient_predivide_factor == 2.0; }},
      {"sparse_gradients", true, K::kRefused, "sparse_gradients: this DeepSpeed feature is not supported yet"},
      // Precision.
      {"fp16.enabled", true, K::kActs, "EnginePrecision.Fp16*", [](const Config& c) { return c.fp16.enabled; }},
      {"fp16.auto_cast", true, K::kRefused, "fp16.auto_cast: true is not supported yet"},
      {"fp16.loss_scale", 128.0, K::kActs, "*LossScaler.*", [](const Config& c) { return c.fp16.scaler.static_scale == 128; }},
      {"fp16.initial_scale_power", 12, K::kActs, "*LossScaler.*",
       [](const Config& c) { return c.fp16.scaler.initial_scale_power == 12; }},
      {"fp16.loss_scale_window", 50, K::kActs, "*LossScaler.*", [](const Config& c) { return c.fp16.scaler.scale_window == 50; }},
      {"fp16.hysteresis", 3, K::kActs, "*LossScaler.*", [](const Config& c) { return c.fp16.scaler.hysteresis == 3; }},
      {"fp16.consecutive_hysteresis", true, K::kActs, "*LossScaler.*",
       [](const Config& c) { return c.fp16.scaler.consecutive_hysteresis; }},
      {"fp16.min_loss_scale", 4.0, K::kActs, "*LossScaler.*", [](const Config& c) { return c.fp16.scaler.min_scale == 4; }},
      {"fp16.fp16_master_weights_and_grads", true, K::kRefused, "fp16.fp16_master_weights_and_grads"},
      {"bf16.enabled", true, K::kActs, "EnginePrecision.Bf16*", [](const Config& c) { return c.bf16; }},
      {"bf16.immediate_grad_update", true, K::kHarmless,
       "when BF16_Optimizer folds each gradient into its fp32 copy; the sums are the same"},
      {"bf16.check_grad_overflow", true, K::kHarmless, "non-finite gradients always skip the step here"},
      {"data_types.grad_accum_dtype", "fp32", K::kRefused, "data_types.grad_accum_dtype: \"fp32\" at stage 0",
       {}, {{"bf16.enabled", true}}},
      {"data_types.grad_accum_dtype", "bf16", K::kActs, "EnginePrecision.Bf16TrainsWithFp32Master — bf16 is what this config accumulates in (support.h)",
       [](const Config& c) { return c.grad_accum_dtype == DType::kBFloat16; }, {{"bf16.enabled", true}}},
      {"bf16.bf16_master_weights_and_grads", true, K::kRefused, "bf16.bf16_master_weights_and_grads"},
      {"bf16.bf16_optimizer_states", true, K::kRefused, "bf16.bf16_optimizer_states"},
      {"data_types.param_dtype", "bf16", K::kHarmless,
       "a check that it names the fp16/bf16 mode's dtype (KeyTable.ParamDtypeMustNameTheComputeDtype)", {},
       {{"bf16.enabled", true}}},
      {"data_types.buffer_dtype", "fp32", K::kRefused, "data_types.buffer_dtype"},
      {"amp", nlohmann::json{{"enabled", true}}, K::kRefused, "amp: this DeepSpeed feature is not supported yet"},
      {"gradient_clipping", 0.5, K::kActs, "Engine.ClipsToGlobalNormAndReportsPreClipNorm", [](const Config& c) { return c.gradient_clipping == 0.5; }},
      // ZeRO.
      {"zero_optimization.stage", 2, K::kActs, "ZeroEquivalence.*", [](const Config& c) { return c.zero.stage == 2; }},
      {"zero_optimization.allgather_partitions", false, K::kHarmless,
       "DeepSpeed has not read it since v0.5.9; the updated partitions are all-gathered either way"},
      {"zero_optimization.allgather_bucket_size", 1000, K::kActs, "ZeroKnobs.ReduceScatterOffAndSmallAllGathers",
       [](const Config& c) { return c.zero.allgather_bucket_size == 1000; }},
      {"zero_optimization.overlap_comm", true, K::kActs, "ZeroEquivalence.*",
       [](const Config& c) { return c.zero.overlap_comm; }},
      {"zero_optimization.reduce_scatter", false, K::kActs, "ZeroKnobs.ReduceScatterOffAndSmallAllGathers",
       [](const Config& c) { return !c.zero.reduce_scatter; }},
      {"zero_optimization.reduce_bucket_size", 1000, K::kActs, "ZeroEquivalence.*",
       [](const Config& c) { return c.zero.reduce_bucket_size == 1000; }},
      {"zero_optimization.contiguous_gradients", false, K::kHarmless,
       "gradients always land in one flat buffer or bucket here; DeepSpeed's flag only avoids fragmentation"},
      {"zero_optimization.load_from_fp32_weights", false, K::kRefused, "zero_optimization.load_from_fp32_weights"},
      {"zero_optimization.round_robin_gradients", true, K::kRefused, "zero_optimization.round_robin_gradients"},
      {"zero_optimization.sub_group_size", 1000, K::kActs, "ZeroEquivalence.*_sub7001*",
       [](const Config& c) { return c.zero.sub_group_size == 1000; }},
      {"zero_optimization.stage3_max_live_parameters", 1000, K::kActs, "Zero3Memory.GatheredPeakFollowsLiveAndReuseSettings",
       [](const Config& c) { return c.zero.stage3_max_live_parameters == 1000; }, kStage3},
      {"zero_optimization.stage3_max_reuse_distance", 1000, K::kActs, "Zero3Memory.GatheredPeakFollowsLiveAndReuseSettings",
       [](const Config& c) { return c.zero.stage3_max_reuse_distance == 1000; }, kStage3},
      {"zero_optimization.stage3_prefetch_bucket_size", 1000, K::kActs, "ZeroEquivalence.*_noprefetch*",
       [](const Config& c) { return c.zero.stage3_prefetch_bucket_size == 1000; }, kStage3},
      {"zero_optimization.stage3_param_persistence_threshold", 1000, K::kActs, "ZeroEquivalence.*_persist20000*",
       [](const Config& c) { return c.zero.stage3_param_persistence_threshold == 1000; }, kStage3},
      {"zero_optimization.stage3_model_persistence_threshold", 1000, K::kActs,
       "EngineStages.Stage3ModelPersistenceThresholdBoundsThePersistentParameters",
       [](const Config& c) { return c.zero.stage3_model_persistence_threshold == 1000; }, kStage3},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save", true, K::kActs, "Zero3Save.*",
       [](const Config& c) { return c.zero.stage3_gather_16bit_weights_on_model_save; }, kStage3},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save", true, K::kActs, "Zero3Save.* — the deprecated spelling",
       [](const Config& c) { return c.zero.stage3_gather_16bit_weights_on_model_save; }, kStage3},
      {"zero_optimization.stage3_use_all_reduce_for_fetch_params", true, K::kRefused,
       "zero_optimization.stage3_use_all_reduce_for_fetch_params", {}, kStage3},
      {"zero_optimization.stage3_module_granularity_threshold", 1000, K::kRefused,
       "zero_optimization.stage3_module_granularity_threshold", {}, kStage3},
      // DeepSpeed's ZeRO model names these fields without "stage3_" (the stage3_ spelling is its alias): both
      // spellings act alike, and the error for a refused one names the stage3_ spelling.
      {"zero_optimization.max_live_parameters", 1000, K::kActs, "Zero3Memory.GatheredPeakFollowsLiveAndReuseSettings",
       [](const Config& c) { return c.zero.stage3_max_live_parameters == 1000; }, kStage3},
      {"zero_optimization.max_reuse_distance", 1000, K::kActs, "Zero3Memory.GatheredPeakFollowsLiveAndReuseSettings",
       [](const Config& c) { return c.zero.stage3_max_reuse_distance == 1000; }, kStage3},
      {"zero_optimization.prefetch_bucket_size", 1000, K::kActs, "ZeroEquivalence.*_noprefetch*",
       [](const Config& c) { return c.zero.stage3_prefetch_bucket_size == 1000; }, kStage3},
      {"zero_optimization.param_persistence_threshold", 1000, K::kActs, "ZeroEquivalence.*_persist20000*",
       [](const Config& c) { return c.zero.stage3_param_persistence_threshold == 1000; }, kStage3},
      {"zero_optimization.model_persistence_threshold", 1000, K::kActs,
       "EngineStages.Stage3ModelPersistenceThresholdBoundsThePersistentParameters",
       [](const Config& c) { return c.zero.stage3_model_persistence_threshold == 1000; }, kStage3},
      {"zero_optimization.gather_16bit_weights_on_model_save", true, K::kActs, "Zero3Save.*",
       [](const Config& c) { return c.zero.stage3_gather_16bit_weights_on_model_save; }, kStage3},
      {"zero_optimization.use_all_reduce_for_fetch_params", true, K::kRefused,
       "zero_optimization.stage3_use_all_reduce_for_fetch_params", {}, kStage3},
      {"zero_optimization.module_granularity_threshold", 1000, K::kRefused,
       "zero_optimization.stage3_module_granularity_threshold", {}, kStage3},
      {"zero_optimization.zero_hpz_partition_size", 2, K::kActs, "ZeroPlusPlus.HierarchicalPartitions*",
       [](const Config& c) { return c.zero.hpz_partition_size == 2; }, kStage3},
      {"zero_optimization.zero_quantized_weights", true, K::kActs, "ZeroPlusPlus.QuantizedWeights*",
       [](const Config& c) { return c.zero.quantized_weights; }, kStage3},
      {"zero_optimization.zero_quantized_nontrainable_weights", true, K::kActs,
       "Zero3Frozen.QuantizedNontrainableWeights*", [](const Config& c) { return c.zero.quantized_nontrainable_weights; },
       kStage3},
      {"zero_optimization.zero_quantized_gradients", true, K::kActs, "ZeroPlusPlus.QuantizedGradients*",
       [](const Config& c) { return c.zero.quantized_gradients; }, kStage3},
      {"zero_optimization.mics_shard_size", 2, K::kRefused, "zero_optimization.mics_shard_size"},
      {"zero_optimization.mics_hierarchical_params_gather", true, K::kRefused,
       "zero_optimization.mics_hierarchical_params_gather"},
      {"zero_optimization.memory_efficient_linear", false, K::kHarmless,
       "how DeepSpeed's ZeRO-3 linear saves its input for backward; the same gradients"},
      {"zero_optimization.pipeline_loading_checkpoint", true, K::kRefused,
       "zero_optimization.pipeline_loading_checkpoint"},
      {"zero_optimization.override_module_apply", false, K::kHarmless, "a hook on Python's nn.Module.apply"},
      {"zero_optimization.elastic_checkpoint", true, K::kHarmless, "every checkpoint here loads on any world size"},
      {"zero_optimization.ignore_unused_parameters", false, K::kRefused, "zero_optimization.ignore_unused_parameters"},
      {"zero_optimization.legacy_stage1", true, K::kRefused, "zero_optimization.legacy_stage1"},
      {"zero_optimization.use_multi_rank_bucket_allreduce", false, K::kHarmless,
       "how DeepSpeed groups its bucket all-reduces by owner; the same sums"},
      {"zero_optimization.log_trace_cache_warnings", true, K::kHarmless, "logging only"},
      {"zero_optimization.stage3_allgather_sequential", true, K::kHarmless,
       "one all-gather per parameter instead of per bucket: the same values"},
      {"zero_optimization.enable_sanity_checks", true, K::kHarmless, "cross-rank asserts; ours check order always"},
      {"zero_optimization.save_muon_momentum_buffer_in_memory", true, K::kHarmless, "no Muon optimizer here"},
      {"zero_optimization.zeropp_loco_param", nlohmann::json{{"err_beta", 0.8}}, K::kRefused,
       "zero_optimization.zeropp_loco_param"},
      {"zero_optimization.offload_optimizer.super_offload", true, K::kRefused,
       "zero_optimization.offload_optimizer.super_offload", {}, kStage3},
      {"zero_optimization.offload_optimizer.cpuadam_cores_perc", 0.5, K::kHarmless,
       "a thread-count hint of super_offload, which is refused"},
      {"zero_optimization.cpu_offload", true, K::kActs, "ConfigDefaults.LegacyCpuOffloadMapsToOffloadOptimizer",
       [](const Config& c) { return c.zero.offload_optimizer.device == OffloadDevice::kCpu; }, kStage2},
      {"zero_optimization.cpu_offload_params", true, K::kActs, "ZeroEquivalence.*_params_cpu* — the legacy switch: offload_param on the CPU",
       [](const Config& c) { return c.zero.offload_param.device == OffloadDevice::kCpu; }, kStage3},
      {"zero_optimization.cpu_offload_param", true, K::kActs, "ZeroEquivalence.*_params_cpu* — the legacy switch (pydantic spelling)",
       [](const Config& c) { return c.zero.offload_param.device == OffloadDevice::kCpu; }, kStage3},
      {"zero_optimization.cpu_offload_use_pin_memory", true, K::kHarmless,
       "DeepSpeed warns that it is deprecated and applies nothing", {}, kStage2},
      // offload_optimizer / offload_param.
      {"zero_optimization.offload_optimizer.device", "cpu", K::kActs, "ZeroEquivalence.*_offload_cpu_*",
       [](const Config& c) { return c.zero.offload_optimizer.device == OffloadDevice::kCpu; }, kStage2},
      {"zero_optimization.offload_optimizer.nvme_path", "/tmp", K::kActs, "ZeroEquivalence.*_offload_nvme_*",
       [](const Config& c) { return c.zero.offload_optimizer.nvme_path == "/tmp"; }, kNvmeOptimizer},
      {"zero_optimization.offload_optimizer.pin_memory", true, K::kActs, "untested: page-locks host buffers only where a GPU exists (host_memory.cpp)",
       [](const Config& c) { return c.zero.offload_optimizer.pin_memory; }, kStage2},
      {"zero_optimization.offload_optimizer.buffer_count", 2, K::kActs, "NvmeStoreBuffers.*",
       [](const Config& c) { return c.zero.offload_optimizer.buffer_count == 2; }, kNvmeOptimizer},
      {"zero_optimization.offload_optimizer.fast_init", true, K::kHarmless,
       "how DeepSpeed first fills its swap files; the same initial state"},
      {"zero_optimization.offload_optimizer.ratio", 0.5, K::kRefused, "zero_optimization.offload_optimizer.ratio",
       {}, {{"zero_optimization.stage", 2}, {"zero_optimization.offload_optimizer.device", "cpu"}}},
      {"zero_optimization.offload_optimizer.pipeline_read", true, K::kHarmless,
       "swap reads always run ahead of the step here (read-ahead in the NVMe store)"},
      {"zero_optimization.offload_optimizer.pipeline_write", true, K::kHarmless,
       "swap writes always overlap the next sub-group's step here"},
      {"zero_optimization.offload_optimizer.pipeline", true, K::kHarmless, "the older name of the two above"},
      {"zero_optimization.offload_param.device", "cpu", K::kActs, "ZeroEquivalence.*_params_cpu*",
       [](const Config& c) { return c.zero.offload_param.device == OffloadDevice::kCpu; }, kStage3},
      {"zero_optimization.offload_param.nvme_path", "/tmp", K::kActs, "ZeroEquivalence.*_params_nvme*",
       [](const Config& c) { return c.zero.offload_param.nvme_path == "/tmp"; }, kNvmeParam},
      {"zero_optimization.offload_param.pin_memory", true, K::kActs, "untested: page-locks host buffers only where a GPU exists (host_memory.cpp)",
       [](const Config& c) { return c.zero.offload_param.pin_memory; }, kStage3},
      {"zero_optimization.offload_param.buffer_count", 2, K::kActs, "NvmeStoreBuffers.*",
       [](const Config& c) { return c.zero.offload_param.buffer_count == 2; }, kNvmeParam},
      {"zero_optimization.offload_param.buffer_size", 1000, K::kHarmless,
       "without NVMe DeepSpeed reads neither buffer_size nor max_in_cpu", {}, kStage3},
      {"zero_optimization.offload_param.max_in_cpu", 1000, K::kHarmless,
       "without NVMe DeepSpeed reads neither buffer_size nor max_in_cpu", {}, kStage3},
      {"zero_optimization.offload_param.buffer_size", 1000, K::kRefused, "zero_optimization.offload_param.buffer_size",
       {}, kNvmeParam},
      {"zero_optimization.offload_param.max_in_cpu", 1000, K::kRefused, "zero_optimization.offload_param.max_in_cpu",
       {}, kNvmeParam},
      // Asynchronous I/O.
      {"aio.block_size", 65536, K::kActs, "AsyncIoBackends.WritesAndReadsBackExactlyInBlocks*", [](const Config& c) { return c.aio.block_size == 65536; }},
      {"aio.queue_depth", 4, K::kActs, "AsyncIoBackends.WritesAndReadsBackExactlyInBlocks*", [](const Config& c) { return c.aio.queue_depth == 4; }},
      {"aio.intra_op_parallelism", 2, K::kActs, "AsyncIoBackends.AioKnobsShapeTheSubmissions*",
       [](const Config& c) { return c.aio.intra_op_parallelism == 2; }},
      {"aio.thread_count", 3, K::kActs, "AsyncIoBackends.AioKnobsShapeTheSubmissions* — the older name of intra_op_parallelism",
       [](const Config& c) { return c.aio.intra_op_parallelism == 3; }},
      {"aio.single_submit", true, K::kActs, "AsyncIoBackends.AioKnobsShapeTheSubmissions*",
       [](const Config& c) { return c.aio.single_submit; }},
      {"aio.overlap_events", false, K::kActs, "AsyncIoBackends.AioKnobsShapeTheSubmissions*",
       [](const Config& c) { return !c.aio.overlap_events; }},
      {"aio.use_gds", true, K::kRefused, "aio.use_gds"},
      // Logging and monitoring.
      {"steps_per_print", 5, K::kActs, "GptTrain.TinyTrainsAndWritesOneMetricsLinePerStep", [](const Config& c) { return c.steps_per_print == 5; }},
      {"wall_clock_breakdown", true, K::kActs, "Engine.WallClockBreakdownPrintsEveryPhaseEachPrintWindow", [](const Config& c) { return c.wall_clock_breakdown; }},
      {"memory_breakdown", true, K::kActs, "EnginePrecision.Bf16WithMemoryBreakdownTrainsExactlyAsWithout",
       [](const Config& c) { return c.memory_breakdown; }},
      {"dump_state", true, K::kRefused, "dump_state"},
      {"tensorboard.enabled", true, K::kActs, "TensorBoardMonitor.*", [](const Config& c) { return c.tensorboard.enabled; }},
      {"tensorboard.output_path", "runs", K::kActs, "TensorBoardMonitor.*",
       [](const Config& c) { return c.tensorboard.output_path == "runs"; }},
      {"tensorboard.job_name", "j", K::kActs, "TensorBoardMonitor.*", [](const Config& c) { return c.tensorboard.job_name == "j"; }},
      {"csv_monitor.enabled", true, K::kActs, "Engine.CsvMonitorWritesOneFilePerEventInDeepSpeedsLayout", [](const Config& c) { return c.csv_monitor.enabled; }},
      {"csv_monitor.output_path", "csv", K::kActs, "Engine.CsvMonitorWritesOneFilePerEventInDeepSpeedsLayout",
       [](const Config& c) { return c.csv_monitor.output_path == "csv"; }},
      {"csv_monitor.job_name", "j", K::kActs, "Engine.CsvMonitorWritesOneFilePerEventInDeepSpeedsLayout", [](const Config& c) { return c.csv_monitor.job_name == "j"; }},
      {"wandb.enabled", true, K::kRefused, "wandb.enabled"},
      {"wandb.output_path", "w", K::kHarmless, "only read when wandb is enabled, which is refused"},
      {"wandb.job_name", "j", K::kHarmless, "only read when wandb is enabled, which is refused"},
      {"wandb.project", "p", K::kHarmless, "only read when wandb is enabled, which is refused"},
      {"wandb.team", "t", K::kHarmless, "only read when wandb is enabled, which is refused"},
      {"wandb.group", "g", K::kHarmless, "only read when wandb is enabled, which is refused"},
      {"comet", nlohmann::json{{"enabled", true}}, K::kRefused, "comet: this DeepSpeed feature is not supported yet"},
      {"flops_profiler.enabled", true, K::kActs, "Engine.FlopsProfilerCountsTheProfiledStepsForwards", [](const Config& c) { return c.flops_profiler.enabled; }},
      {"flops_profiler.profile_step", 3, K::kActs, "Engine.FlopsProfilerCountsTheProfiledStepsForwards",
       [](const Config& c) { return c.flops_profiler.profile_step == 3; }},
      {"flops_profiler.module_depth", 2, K::kActs, "Engine.FlopsProfilerCountsTheProfiledStepsForwards",
       [](const Config& c) { return c.flops_profiler.module_depth == 2; }},
      {"flops_profiler.top_modules", 2, K::kActs, "Engine.FlopsProfilerCountsTheProfiledStepsForwards",
       [](const Config& c) { return c.flops_profiler.top_modules == 2; }},
      {"flops_profiler.detailed", false, K::kActs, "Engine.FlopsProfilerCountsTheProfiledStepsForwards", [](const Config& c) { return !c.flops_profiler.detailed; }},
      {"flops_profiler.output_file", "f.txt", K::kActs, "Engine.FlopsProfilerCountsTheProfiledStepsForwards",
       [](const Config& c) { return c.flops_profiler.output_file == "f.txt"; }},
      {"flops_profiler.recompute_fwd_factor", 1.0, K::kActs, "Engine.FlopsProfilerCountsTheProfiledStepsForwards",
       [](const Config& c) { return c.flops_profiler.recompute_fwd_factor == 1.0; }},
      {"comms_logger.enabled", true, K::kActs, "CommsLogger.*", [](const Config& c) { return c.comms_logger.enabled; }},
      {"comms_logger.verbose", true, K::kActs, "CommsLogger.*", [](const Config& c) { return c.comms_logger.verbose; }},
      {"comms_logger.prof_all", false, K::kActs, "CommsLogger.*", [](const Config& c) { return !c.comms_logger.prof_all; }},
      {"comms_logger.debug", true, K::kActs, "CommsLogger.*", [](const Config& c) { return c.comms_logger.debug; }},
      {"comms_logger.prof_ops", nlohmann::json::array({"all_reduce"}), K::kActs, "CommsLogger.*",
       [](const Config& c) { return c.comms_logger.prof_ops == std::vector<std::string>{"all_reduce"}; }},
      {"timers", nlohmann::json{{"throughput", {{"enabled", true}}}}, K::kHarmless,
       "DeepSpeed's throughput timer; the step log here always reports time and samples/s"},
      // Activation checkpointing.
      {"activation_checkpointing.partition_activations", true, K::kActs, "ActivationCheckpointing.*",
       [](const Config& c) { return c.activation_checkpointing.partition_activations; }},
      {"activation_checkpointing.cpu_checkpointing", true, K::kActs, "ActivationCheckpointing.*",
       [](const Config& c) { return c.activation_checkpointing.cpu_checkpointing; }},
      {"activation_checkpointing.contiguous_memory_optimization", true, K::kActs, "ActivationCheckpointing.*",
       [](const Config& c) { return c.activation_checkpointing.contiguous_memory_optimization; },
       {{"activation_checkpointing.number_checkpoints", 2}}},
      {"activation_checkpointing.number_checkpoints", 4, K::kActs, "ActivationCheckpointing.*",
       [](const Config& c) { return c.activation_checkpointing.number_checkpoints == 4; }},
      {"activation_checkpointing.synchronize_checkpoint_boundary", true, K::kActs, "ActivationCheckpointing.*",
       [](const Config& c) { return c.activation_checkpointing.synchronize_checkpoint_boundary; }},
      {"activation_checkpointing.profile", true, K::kActs, "ActivationCheckpointing.*",
       [](const Config& c) { return c.activation_checkpointing.profile; }},
      {"tensor_parallel.autotp_size", 2, K::kActs, "TensorParallel.*",
       [](const Config& c) { return c.tensor_parallel_size == 2; }},
      // Checkpoints.
      {"checkpoint.tag_validation", "Fail", K::kActs, "untested: the save compares every rank's tag (checkpointer.cpp)",
       [](const Config& c) { return c.checkpoint.tag_validation == "Fail"; }},
      {"checkpoint.load_universal", true, K::kHarmless, "every checkpoint here is universal"},
      {"checkpoint.use_node_local_storage", true, K::kHarmless, "every rank writes its own shard file either way"},
      {"checkpoint.parallel_write", nlohmann::json{{"pipeline_stage", true}}, K::kHarmless,
       "the order in which pipeline stages write; what they write is the same"},
      {"checkpoint_parallel_write_pipeline", true, K::kHarmless,
       "the order in which pipeline stages write; what they write is the same"},
      // Block-sparse attention: parsed here, applied by the model (gpt-train --sparse_attention, Python's
      // SparseSelfAttention); the engine refuses it otherwise (InitOptions::sparse_attention_applied).
      {"sparse_attention.mode", "bigbird", K::kActs, "SparseAttentionGpt.*",
       [](const Config& c) { return c.sparse_attention && c.sparse_attention->mode == "bigbird"; }},
      {"sparse_attention.block", 32, K::kActs, "SparseAttentionGpt.*",
       [](const Config& c) { return c.sparse_attention && c.sparse_attention->block == 32; }},
      {"sparse_attention.attention", "unidirectional", K::kActs, "SparseAttentionGpt.*",
       [](const Config& c) { return c.sparse_attention && c.sparse_attention->unidirectional; }},
      {"sparse_attention.num_local_blocks", 8, K::kActs, "python.sparse_attention",
       [](const Config& c) { return c.sparse_attention && c.sparse_attention->num_local_blocks == 8; }},
      {"sparse_attention.num_random_blocks", 2, K::kActs, "python.sparse_attention",
       [](const Config& c) { return c.sparse_attention && c.sparse_attention->num_random_blocks == 2; },
       {{"sparse_attention.mode", "variable"}}},
      {"sparse_attention.num_sliding_window_blocks", 5, K::kActs, "python.sparse_attention",
       [](const Config& c) { return c.sparse_attention && c.sparse_attention->num_sliding_window_blocks == 5; },
       {{"sparse_attention.mode", "bslongformer"}}},
      // DeepSpeed Compression: parsed here, acted on by python/dscpp/compression (the engine refuses it switched on
      // unless the program applies it: InitOptions::compression_applied).
      {"compression_training.weight_quantization.shared_parameters.enabled", true, K::kActs, "python.compression",
       [](const Config& c) { return c.compression.weight_quantization.enabled; },
       {{"compression_training.weight_quantization.different_groups.wq.modules", {"fc"}},
        {"compression_training.weight_quantization.different_groups.wq.params.start_bits", 8},
        {"compression_training.weight_quantization.different_groups.wq.params.target_bits", 4}}},
      {"compression_training.weight_quantization.shared_parameters.quantize_weight_in_forward", true, K::kActs,
       "python.compression", [](const Config& c) { return c.compression.quantize_weight_in_forward; }},
      {"compression_training.weight_quantization.shared_parameters.quantizer_kernel", true, K::kRefused,
       "compression_training.weight_quantization.shared_parameters.quantizer_kernel"},
      {"compression_training.activation_quantization.shared_parameters.range_calibration", "static", K::kActs,
       "python.compression", [](const Config& c) { return c.compression.activation_quantization.range_calibration == "static"; }},
      {"compression_training.sparse_pruning.shared_parameters.method", "topk", K::kActs, "python.compression",
       [](const Config& c) { return c.compression.sparse_pruning.method == "topk"; }},
      {"compression_training.sparse_pruning.shared_parameters.block_pattern", "4x1", K::kHarmless,
       "snip_momentum's (refused); DeepSpeed reads it for no other method"},
      {"compression_training.row_pruning.shared_parameters.schedule_offset", 5, K::kActs, "python.compression",
       [](const Config& c) { return c.compression.row_pruning.schedule_offset == 5; }},
      {"compression_training.layer_reduction.enabled", true, K::kActs, "python.compression",
       [](const Config& c) { return c.compression.layer_reduction.enabled; },
       {{"compression_training.layer_reduction.module_name_prefix", "h"},
        {"compression_training.layer_reduction.teacher_layer", {1, 3}}}},
      {"elasticity", nlohmann::json{{"enabled", true}}, K::kRefused, "elasticity"},
      {"data_efficiency", nlohmann::json{{"enabled", true}}, K::kRefused, "data_efficiency"},
      {"curriculum_learning", nlohmann::json{{"enabled", true}}, K::kRefused, "curriculum_learning"},
      {"autotuning", nlohmann::json{{"enabled", true}}, K::kRefused, "autotuning"},
      {"nebula", nlohmann::json{{"enabled", true}}, K::kRefused, "nebula"},
      {"eigenvalue", nlohmann::json{{"enabled", true}}, K::kRefused, "eigenvalue"},
      {"progressive_layer_drop", nlohmann::json{{"enabled", true}}, K::kRefused, "progressive_layer_drop"},
      {"quantize_training", nlohmann::json{{"enabled", true}}, K::kRefused, "quantize_training"},
      // The hybrid engine: what a training engine's generate() does (Python's DeepSpeedHybridEngine).
      {"hybrid_engine.enabled", true, K::kActs, "python.hybrid_engine",
       [](const Config& c) { return c.hybrid_engine.enabled; }},
      {"hybrid_engine.max_out_tokens", 64, K::kHarmless,
       "it sizes DeepSpeed's inference kernels' workspace; generate() here runs the model's own forward"},
      {"hybrid_engine.pin_parameters", false, K::kActs, "python.hybrid_engine",
       [](const Config& c) { return !c.hybrid_engine.pin_parameters; }},
      {"hybrid_engine.release_inference_cache", true, K::kHarmless,
       "nothing gathered for generate() outlives the call here, which is what true asks DeepSpeed for"},
      {"hybrid_engine.tp_gather_partition_size", 4, K::kHarmless,
       "it bounds how many layers DeepSpeed holds gathered while it slices them for inference_tp_size; here the "
       "whole model is gathered for the call, as pin_parameters asks, and sliced from there"},
      {"hybrid_engine.inference_tp_size", 2, K::kActs, "python.hybrid_engine",
       [](const Config& c) { return c.hybrid_engine.inference_tp_size == 2; }},
      {"hybrid_engine.enable_cuda_graph", true, K::kRefused, "hybrid_engine.enable_cuda_graph"},
      {"compile", nlohmann::json{{"enabled", true}}, K::kRefused, "compile"},
      {"weight_quantization", nlohmann::json{{"post_init_quant", {{"enabled", true}}}}, K::kRefused,
       "weight_quantization"},
      {"torch_autocast", nlohmann::json{{"enabled", true}}, K::kRefused, "torch_autocast"},
      {"graph_harvesting", true, K::kRefused, "graph_harvesting"},
      {"disable_allgather", true, K::kRefused, "disable_allgather"},
      // Pipeline parallelism: PipelineEngine reads the section (tests/pipe).
      {"pipeline.stages", 2, K::kActs, "Pipeline.GptTrainNamesWhatDoesNotPipeline",
       [](const Config& c) { return c.pipeline.stages == 2; }},
      {"pipeline.partition", "uniform", K::kActs, "Pipeline.EveryStageHoldsItsLayersAndTheTiedEmbeddingTwice",
       [](const Config& c) { return c.pipeline.partition == "uniform"; }},
      {"pipeline.activation_checkpoint_interval", 1, K::kActs, "Pipeline.GptTrainPipelinedGivesTheOneProcessLosses",
       [](const Config& c) { return c.pipeline.activation_checkpoint_interval == 1; }},
      {"pipeline.pipe_partitioned", false, K::kHarmless,
       "splits what a stage sends over the tensor-parallel group; the values sent are the same"},
      {"pipeline.grad_partitioned", false, K::kHarmless,
       "splits the gradients a stage sends over the tensor-parallel group; the values sent are the same"},
      {"pipeline.seed_layers", true, K::kRefused, "pipeline.seed_layers"},
      {"zero_allow_untested_optimizer", true, K::kHarmless, "every optimizer here runs under every stage"},
      {"zero_force_ds_cpu_optimizer", false, K::kHarmless, "offload always steps the flat CPU Adam here"},
      {"managed_gradient_accumulation", false, K::kRefused, "managed_gradient_accumulation"},
      {"gradient_allreduce_op", "sum", K::kRefused, "gradient_allreduce_op"},
      {"datastates_ckpt", nlohmann::json::object(), K::kRefused, "datastates_ckpt"},
      {"vocabulary_size", 50257, K::kHarmless, "DeepSpeed only warns when it is not a multiple of 8"},
      {"log_level", "info", K::kHarmless, "logging only"},
      {"dataloader_drop_last", true, K::kHarmless, "the engine builds no dataloader in C++"},
      {"sequence_parallel_size", 2, K::kActs, "SequenceParallel.*",
       [](const Config& c) { return c.sequence_parallel_size == 2; }},
      {"seq_parallel_communication_data_type", "bf16", K::kActs,
       "SequenceParallel.GradientsTravelInTheSequenceParallelCommDtype",
       [](const Config& c) { return c.seq_parallel_communication_data_type == DType::kBFloat16; }},
      {"use_data_before_expert_parallelism", true, K::kHarmless, "no expert parallelism here"},
  };
}

std::string label(const Row& row) { return row.path + " = " + row.value.dump(); }

ConfigOptions options_for(const Row& row) {
  ConfigOptions options;
  for (const auto& [path, value] : row.context.items()) options.overrides[path] = value;
  options.overrides[row.path] = row.value;
  return options;
}

TEST(KeyTable, EveryRowBehavesAsItSays) {
  for (const Row& row : table()) {
    SCOPED_TRACE(label(row));
    ASSERT_FALSE(row.why.empty());
    std::vector<std::string> warnings;
    switch (row.kind) {
      case Kind::kActs: {
        ASSERT_TRUE(row.took) << "an acting row needs a check that the value arrived";
        const Config config = parse(kBase, options_for(row), &warnings);
        EXPECT_TRUE(row.took(config));
        // And it is not what the parse gives without the key: the row's value is a real change.
        ConfigOptions without = options_for(row);
        without.overrides.erase(row.path);
        // (Skipped where the key is an alias of another, or the row's context sets it too.)
        if (row.path != "zero_optimization.stage3_gather_fp16_weights_on_model_save" &&
            row.path.rfind("zero_optimization.cpu_offload", 0) != 0 && row.path != "scheduler.type" &&
            !row.context.contains(row.path)) {
          EXPECT_FALSE(row.took(parse(kBase, without))) << "the value is DeepSpeed's default: pick another";
        }
        break;
      }
      case Kind::kHarmless:
        EXPECT_NO_THROW(parse(kBase, options_for(row), &warnings));
        break;
      case Kind::kRefused: {
        const std::string error = error_of(kBase, options_for(row));
        EXPECT_NE(error.find(row.why), std::string::npos) << error;
        EXPECT_NE(error.find("not supported yet"), std::string::npos) << error;
        break;
      }
    }
    EXPECT_TRUE(warnings.empty()) << warnings.front();
  }
}

// A key a section does not have is an error with the closest key — our rule for every section (DeepSpeed forbids
// extras only in its pydantic ones, zero_optimization and the monitors; fp16, bf16, aio, … it reads with dict.get);
// an unknown top-level key stays a warning, as DeepSpeed ignores it.
TEST(KeyTable, UnknownKeysInsideSectionsAreErrors) {
  const std::string error = error_of({{"train_batch_size", 2},
                                      {"zero_optimization", {{"stage", 3}, {"stage3_prefetch_bucket_sise", 1000}}}});
  EXPECT_NE(error.find("unknown config key 'zero_optimization.stage3_prefetch_bucket_sise'"), std::string::npos)
      << error;
  EXPECT_NE(error.find("did you mean 'zero_optimization.stage3_prefetch_bucket_size'?"), std::string::npos) << error;
  for (const char* section : {"fp16", "bf16", "aio", "activation_checkpointing", "flops_profiler", "comms_logger"}) {
    const std::string e = error_of({{"train_batch_size", 2}, {section, {{"enabeld", true}}}});
    EXPECT_NE(e.find(std::string("unknown config key '") + section + ".enabeld'"), std::string::npos) << e;
  }
  EXPECT_NE(error_of({{"train_batch_size", 2},
                      {"zero_optimization", {{"stage", 3}, {"offload_param", {{"device", "cpu"}, {"pin_memroy", true}}}}}})
                .find("did you mean 'zero_optimization.offload_param.pin_memory'?"),
            std::string::npos);
  EXPECT_NE(error.find("deepspeed.cpp refuses unknown keys inside a section"), std::string::npos) << error;
  std::vector<std::string> warnings;
  parse({{"train_batch_size", 2}, {"my_own_key", 1}}, {}, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("unknown config key 'my_own_key' (ignored)"), std::string::npos) << warnings[0];
}

// Both spellings of a ZeRO field at once is an error, as in DeepSpeed (its model takes one and refuses the other).
TEST(KeyTable, AZeroFieldAndItsStage3AliasTogetherAreRefused) {
  const std::string error = error_of({{"train_batch_size", 2},
                                      {"zero_optimization", {{"stage", 3}, {"prefetch_bucket_size", 1000},
                                                             {"stage3_prefetch_bucket_size", 2000}}}});
  EXPECT_NE(error.find("zero_optimization.prefetch_bucket_size = 1000: DeepSpeed's other name for "
                       "zero_optimization.stage3_prefetch_bucket_size, which is also given"),
            std::string::npos)
      << error;
}

// DeepSpeed 0.19.8 reads seq_parallel_communication_data_type (runtime/constants.py); the shorter spelling some of
// its docs print is unknown to it: a warning pointing at the key it reads. A dtype DeepSpeed does not know is refused.
TEST(KeyTable, SeqParallelCommunicationDataTypeIsTheSpellingDeepSpeedReads) {
  std::vector<std::string> warnings;
  parse({{"train_batch_size", 2}, {"seq_parallel_comm_data_type", "fp32"}}, {}, &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("did you mean 'seq_parallel_communication_data_type'?"), std::string::npos)
      << warnings[0];
  EXPECT_NE(error_of({{"train_batch_size", 2}, {"seq_parallel_communication_data_type", "int8"}})
                .find("seq_parallel_communication_data_type = \"int8\""),
            std::string::npos);
}

TEST(KeyTable, ParamDtypeMustNameTheComputeDtype) {
  const std::string error = error_of({{"train_batch_size", 2}, {"bf16", {{"enabled", true}}},
                                      {"data_types", {{"param_dtype", "fp16"}}}});
  EXPECT_NE(error.find("data_types.param_dtype = \"fp16\": expected \"bf16\""), std::string::npos) << error;
}

// The tests the acting rows name exist in this build's CTest list (parameterised names match without their
// instantiation prefix), so the table cannot point at a test nobody wrote.
TEST(KeyTable, NamedEffectTestsExist) {
  const auto listed = run_command("ctest -N --test-dir " + std::string(DSCPP_BINARY_DIR));
  ASSERT_EQ(listed.code, 0) << listed.err;
  std::vector<std::string> names;
  std::istringstream in(listed.out);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find(": ");
    if (line.find("Test") == std::string::npos || at == std::string::npos) continue;
    std::string name = line.substr(at + 2);
    name = name.substr(0, name.find("  #"));  // gtest_discover_tests appends "  # GetParam() = …"
    const size_t slash = name.find('/');
    if (slash != std::string::npos && name.find('.') > slash) name = name.substr(slash + 1);
    names.push_back(name);
  }
  ASSERT_GT(names.size(), 100u) << listed.out;
  int untested = 0;
  for (const Row& row : table()) {
    if (row.kind != Kind::kActs) continue;
    if (row.why.rfind("untested: ", 0) == 0) {
      ++untested;
      continue;
    }
    const std::string pattern = row.why.substr(0, row.why.find(' '));
    const bool found = std::any_of(names.begin(), names.end(), [&](const std::string& name) {
      return ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
    });
    EXPECT_TRUE(found) << label(row) << ": no registered test matches " << pattern;
  }
  // The keys that act without a test showing it (prescale_gradients, gradient_predivide_factor,
  // communication_data_type, pin_memory twice, tag_validation): a number that may only fall.
  EXPECT_LE(untested, 6);
}

// Every key the parser knows is in the table (so a new key gets a row saying what it does), and the table has no
// key the parser does not know.
TEST(KeyTable, CoversEveryKeyTheParserKnows) {
  std::set<std::string> in_table;
  for (const Row& row : table()) {
    in_table.insert(row.path);
    for (const auto& [path, value] : row.context.items()) in_table.insert(path);
  }
  // The resolved document of a config with every section written out lists every key the parser reads.
  nlohmann::json everything = kBase;
  everything["zero_optimization"] = {{"stage", 3}, {"offload_param", {{"device", "nvme"}, {"nvme_path", "/tmp"}}},
                                     {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/tmp"}}}};
  everything["scheduler"] = {{"type", "WarmupLR"}};
  everything["data_types"] = nlohmann::json::object();
  const Config config = parse(everything);
  std::vector<std::string> missing;
  std::function<void(const nlohmann::json&, const std::string&)> walk = [&](const nlohmann::json& node,
                                                                            const std::string& prefix) {
    for (const auto& [key, value] : node.items()) {
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      // Sections whose own keys are tested by their parsers' tests (optimizer/scheduler params).
      if (path.rfind("optimizer.params.", 0) == 0 || path.rfind("scheduler.", 0) == 0 || path == "optimizer.type") {
        continue;
      }
      if (value.is_object() && !value.empty()) {
        walk(value, path);
      } else if (!in_table.count(path)) {
        missing.push_back(path);
      }
    }
  };
  walk(config.resolved, "");
  EXPECT_TRUE(missing.empty()) << "keys without a row: " << ::testing::PrintToString(missing);
}

}  // namespace
}  // namespace dscpp::testing
