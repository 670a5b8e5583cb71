// "zero_optimization" (with its offload sub-sections) and "aio": ZeRO stage, buckets, offload policy.
#include "dscpp/config/config_error.h"
#include "dscpp/config/sections.h"

namespace dscpp {
namespace {

OffloadDevice parse_device(JsonReader& section) {
  std::string device = section.get_choice("device", "none", {"none", "cpu", "nvme"});
  if (device == "cpu") return OffloadDevice::kCpu;
  if (device == "nvme") return OffloadDevice::kNvme;
  return OffloadDevice::kNone;
}

std::string parse_nvme_path(JsonReader& section, OffloadDevice device) {
  std::string path = section.get_optional_string("nvme_path").value_or("");
  section.require(device != OffloadDevice::kNvme || !path.empty(), "nvme_path",
                  "a directory path when device is \"nvme\"");
  return path;
}

OffloadOptimizerConfig parse_offload_optimizer(JsonReader& section) {
  OffloadOptimizerConfig c;
  c.device = parse_device(section);
  c.nvme_path = parse_nvme_path(section, c.device);
  c.pin_memory = section.get_bool("pin_memory", false);
  c.buffer_count = static_cast<int>(section.get_int("buffer_count", 4, 1, 1024));
  c.fast_init = section.get_bool("fast_init", false);
  c.ratio = section.get_number("ratio", 1.0);
  section.require(c.ratio >= 0.0 && c.ratio <= 1.0, "ratio", "a number in [0, 1]");
  section.accept({"pipeline", "pipeline_read", "pipeline_write", "cpuadam_cores_perc"});
  section.accept_only_default("super_offload", false);
  section.finish();
  return c;
}

OffloadParamConfig parse_offload_param(JsonReader& section) {
  OffloadParamConfig c;
  c.device = parse_device(section);
  c.nvme_path = parse_nvme_path(section, c.device);
  c.pin_memory = section.get_bool("pin_memory", false);
  c.buffer_count = static_cast<int>(section.get_int("buffer_count", 5, 1, 1024));
  c.buffer_size = section.get_int("buffer_size", 100'000'000, 1);
  c.max_in_cpu = section.get_int("max_in_cpu", 1'000'000'000, 0);
  // DeepSpeed's NVMe parameter swapper stages parameters through buffer_count buffers of buffer_size elements and
  // keeps up to max_in_cpu elements in host memory; ours swaps whole partition shards, so other values would be
  // ignored: refused with NVMe (without it DeepSpeed reads neither).
  if (c.device == OffloadDevice::kNvme) {
    section.require(c.buffer_size == 100'000'000, "buffer_size",
                    "100000000, DeepSpeed's default (other NVMe parameter buffer sizes are not supported yet)");
    section.require(c.max_in_cpu == 1'000'000'000, "max_in_cpu",
                    "1000000000, DeepSpeed's default (other NVMe parameter host caches are not supported yet)");
  }
  section.finish();
  return c;
}

}  // namespace

ZeroConfig parse_zero(JsonReader& z) {
  ZeroConfig c;
  c.stage = static_cast<int>(z.get_int("stage", 0, 0, 3));
  c.contiguous_gradients = z.get_bool("contiguous_gradients", true);
  c.reduce_scatter = z.get_bool("reduce_scatter", true);
  c.reduce_bucket_size = z.get_int("reduce_bucket_size", 500'000'000, 1, JsonReader::kNoMax);
  c.allgather_partitions = z.get_bool("allgather_partitions", true);
  c.allgather_bucket_size = z.get_int("allgather_bucket_size", 500'000'000, 1, JsonReader::kNoMax);
  // DeepSpeed: overlap_comm unset means on for stage 3 (prefetch needs it), off below.
  c.overlap_comm = z.get_optional_bool("overlap_comm").value_or(c.stage == 3);
  z.get_bool("overlap_comm", c.overlap_comm);  // writes the resolved default out
  c.sub_group_size = z.get_int("sub_group_size", 1'000'000'000, 1, JsonReader::kNoMax);
  c.stage3_prefetch_bucket_size = z.get_int("stage3_prefetch_bucket_size", 50'000'000, 0, JsonReader::kNoMax);
  c.stage3_param_persistence_threshold =
      z.get_int("stage3_param_persistence_threshold", 100'000, 0, JsonReader::kNoMax);
  c.stage3_model_persistence_threshold =
      z.get_int("stage3_model_persistence_threshold", JsonReader::kNoMax, 0, JsonReader::kNoMax);
  c.stage3_max_live_parameters = z.get_int("stage3_max_live_parameters", 1'000'000'000, 0, JsonReader::kNoMax);
  c.stage3_max_reuse_distance = z.get_int("stage3_max_reuse_distance", 1'000'000'000, 0, JsonReader::kNoMax);
  // The deprecated fp16 spelling still works when the 16-bit one is absent.
  bool legacy_gather = false;
  if (z.has("stage3_gather_fp16_weights_on_model_save")) {
    legacy_gather = z.get_bool("stage3_gather_fp16_weights_on_model_save", false);
  }
  c.stage3_gather_16bit_weights_on_model_save =
      z.get_bool("stage3_gather_16bit_weights_on_model_save", legacy_gather);
  c.round_robin_gradients = z.get_bool("round_robin_gradients", false);

  JsonReader offload_optimizer = z.section("offload_optimizer");
  c.offload_optimizer = parse_offload_optimizer(offload_optimizer);
  JsonReader offload_param = z.section("offload_param");
  c.offload_param = parse_offload_param(offload_param);
  if (c.offload_param.device != OffloadDevice::kNone && c.stage < 3) {
    throw ConfigError("zero_optimization.offload_param.device = \"" +
                      std::string(c.offload_param.device == OffloadDevice::kCpu ? "cpu" : "nvme") +
                      "\" needs zero_optimization.stage 3 (got stage " + std::to_string(c.stage) +
                      "): parameter offload partitions the parameters; use offload_optimizer below stage 3");
  }
  // DeepSpeed keys whose every value means what this engine does (see tests/config/key_table_test.cpp for each
  // reason): "cpu_offload*" were folded into the offload sections before parsing (DeepSpeed applies nothing for
  // cpu_offload_use_pin_memory); gradients always land in one flat buffer (contiguous_gradients); every checkpoint
  // is elastic; the rest tune Python-side mechanics.
  z.accept({"cpu_offload", "cpu_offload_param", "cpu_offload_params", "cpu_offload_use_pin_memory",
            "elastic_checkpoint", "memory_efficient_linear", "override_module_apply", "use_multi_rank_bucket_allreduce",
            "log_trace_cache_warnings", "stage3_allgather_sequential", "enable_sanity_checks",
            "save_muon_momentum_buffer_in_memory"});
  // DeepSpeed settings this engine has only at their default.
  z.accept_only_default("zeropp_loco_param", nullptr);  // ZeRO++ LoCo error feedback
  z.accept_only_default("load_from_fp32_weights", true);
  z.accept_only_default("ignore_unused_parameters", true);
  z.accept_only_default("legacy_stage1", false);
  z.accept_only_default("pipeline_loading_checkpoint", false);
  z.accept_only_default("stage3_use_all_reduce_for_fetch_params", false);
  z.accept_only_default("stage3_module_granularity_threshold", 0);
  z.accept_only_default("mics_hierarchical_params_gather", false);
  // ZeRO++ hpZ: a secondary partition of the stage-3 weights inside groups of this many ranks (1: off). Whether it
  // divides the data-parallel size is checked when the engine is assembled (the world is known there).
  c.hpz_partition_size = z.get_int("zero_hpz_partition_size", 1, 1);
  z.require(c.hpz_partition_size == 1 || c.stage == 3, "zero_hpz_partition_size",
            "1 below stage 3: hpZ keeps a secondary partition of ZeRO-3's weights, and stage " +
                std::to_string(c.stage) + " keeps whole weights on every rank");
  // MiCS: off at -1 (or 0), DeepSpeed's "not used".
  const int64_t mics = z.get_int("mics_shard_size", -1, -1);
  z.require(mics <= 0, "mics_shard_size", "-1: MiCS sharding is not supported yet");
  // ZeRO++ qwZ: the stage-3 weight all-gathers in int8 blocks. Below stage 3 no weight is gathered, so the key
  // would do nothing (DeepSpeed reads it only in stage 3): a config that sets it there is stopped instead.
  c.quantized_weights = z.get_bool("zero_quantized_weights", false);
  z.require(!c.quantized_weights || c.stage == 3, "zero_quantized_weights",
            "false below stage 3: ZeRO++ quantizes ZeRO-3's weight all-gather, and stage " + std::to_string(c.stage) +
                " keeps whole weights on every rank");
  // ZeRO++: ZeRO-3's frozen parameters' shards kept as int8 blocks, gathered as they are (DeepSpeed reads it in
  // stage 3 only, where frozen parameters are partitioned).
  c.quantized_nontrainable_weights = z.get_bool("zero_quantized_nontrainable_weights", false);
  z.require(!c.quantized_nontrainable_weights || c.stage == 3, "zero_quantized_nontrainable_weights",
            "false below stage 3: ZeRO++ stores ZeRO-3's shards of the frozen parameters quantized, and stage " +
                std::to_string(c.stage) + " keeps whole weights on every rank");
  // ZeRO++ qgZ: ZeRO-3's gradient reduce-scatter as an all-to-all of 4-bit blocks (DeepSpeed reads it in stage 3 only).
  c.quantized_gradients = z.get_bool("zero_quantized_gradients", false);
  z.require(!c.quantized_gradients || c.stage == 3, "zero_quantized_gradients",
            "false below stage 3: ZeRO++ quantizes ZeRO-3's gradient reduce-scatter, and this config has stage " +
                std::to_string(c.stage));
  z.finish();
  return c;
}

AioConfig parse_aio(JsonReader& a) {
  AioConfig c;
  c.block_size = a.get_int("block_size", 1'048'576, 1);
  a.require(c.block_size % AioConfig::kAlignment == 0, "block_size",
            "a positive multiple of " + std::to_string(AioConfig::kAlignment) + " bytes (O_DIRECT's alignment)");
  c.queue_depth = static_cast<int>(a.get_int("queue_depth", 8, 1, 65536));
  a.rename("thread_count", "intra_op_parallelism");  // DeepSpeed's older name
  c.intra_op_parallelism = static_cast<int>(a.get_int("intra_op_parallelism", 1, 1, 1024));
  c.single_submit = a.get_bool("single_submit", false);
  c.overlap_events = a.get_bool("overlap_events", true);
  a.accept_only_default("use_gds", false);
  a.finish();
  return c;
}

}  // namespace dscpp
