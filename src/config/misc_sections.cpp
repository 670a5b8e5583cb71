// The smaller sections: activation checkpointing, monitors, flops profiler, comms logger, checkpoint options, the
// hybrid engine.
#include "dscpp/config/config_error.h"
#include "dscpp/config/sections.h"

namespace dscpp {
namespace {

ActivationCheckpointingConfig parse_activation_checkpointing(JsonReader& s) {
  ActivationCheckpointingConfig c;
  c.partition_activations = s.get_bool("partition_activations", false);
  c.cpu_checkpointing = s.get_bool("cpu_checkpointing", false);
  c.contiguous_memory_optimization = s.get_bool("contiguous_memory_optimization", false);
  c.number_checkpoints = s.get_optional_int("number_checkpoints", 1);
  // Its buffer holds number_checkpoints blocks' activations, so the count is needed even if nothing is checkpointed.
  if (c.contiguous_memory_optimization && !c.number_checkpoints) {
    throw ConfigError("activation_checkpointing.contiguous_memory_optimization = true needs "
                      "activation_checkpointing.number_checkpoints (a count >= 1): the number of checkpointed blocks "
                      "per forward, which sizes its buffer");
  }
  c.synchronize_checkpoint_boundary = s.get_bool("synchronize_checkpoint_boundary", false);
  c.profile = s.get_bool("profile", false);
  s.finish();
  return c;
}

MonitorConfig parse_monitor(JsonReader& s, bool is_wandb) {
  MonitorConfig c;
  c.enabled = s.get_bool("enabled", false);
  c.output_path = s.get_string("output_path", "");
  c.job_name = s.get_string("job_name", "DeepSpeedJobName");
  if (is_wandb) s.accept({"team", "group", "project"});
  s.finish();
  return c;
}

FlopsProfilerConfig parse_flops_profiler(JsonReader& s) {
  FlopsProfilerConfig c;
  c.enabled = s.get_bool("enabled", false);
  c.profile_step = s.get_int("profile_step", 1, 1);
  c.module_depth = static_cast<int>(s.get_int("module_depth", -1, -1, 1'000'000));
  c.top_modules = static_cast<int>(s.get_int("top_modules", 1, 0, 1'000'000));
  c.detailed = s.get_bool("detailed", true);
  c.output_file = s.get_optional_string("output_file").value_or("");
  c.recompute_fwd_factor = s.get_number("recompute_fwd_factor", 0.0);
  s.require(c.recompute_fwd_factor >= 0, "recompute_fwd_factor", "a number >= 0");
  s.finish();
  return c;
}

CommsLoggerConfig parse_comms_logger(JsonReader& s) {
  CommsLoggerConfig c;
  c.enabled = s.get_bool("enabled", false);
  c.verbose = s.get_bool("verbose", false);
  c.prof_all = s.get_bool("prof_all", true);
  c.debug = s.get_bool("debug", false);
  // DeepSpeed's torch.distributed names are accepted for ours.
  c.prof_ops = s.get_string_list("prof_ops", {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier",
                                              "reduce_scatter_tensor", "all_gather_into_tensor", "send",
                                              "recv", "isend", "irecv"});
  for (auto& op : c.prof_ops) {
    if (op == "isend") op = "send";
    if (op == "irecv") op = "recv";
    if (op == "reduce_scatter_tensor") op = "reduce_scatter";
    if (op == "all_gather_into_tensor") op = "all_gather";
  }
  s.finish();
  return c;
}

CheckpointConfig parse_checkpoint(JsonReader& s) {
  CheckpointConfig c;
  c.tag_validation = s.get_choice("tag_validation", "Warn", {"Ignore", "Warn", "Fail"});
  c.load_universal = s.get_bool("load_universal", false);
  s.accept({"use_node_local_storage", "parallel_write"});
  s.finish();
  return c;
}

PipelineConfig parse_pipeline(JsonReader& s) {
  PipelineConfig c;
  c.stages = static_cast<int>(s.get_int("stages", 1, 1));
  c.partition = s.get_string("partition", "parameters");
  if (c.partition == "best") c.partition = "parameters";
  s.require(c.partition == "parameters" || c.partition == "uniform" || c.partition.rfind("type:", 0) == 0,
            "partition", "one of parameters, uniform, type:REGEX (or DeepSpeed's default best, which is parameters)");
  c.activation_checkpoint_interval = static_cast<int>(s.get_int("activation_checkpoint_interval", 0, 0));
  // pipe_partitioned / grad_partitioned split what a stage sends over the tensor-parallel group to cut its volume;
  // the values sent are the same either way. seed_layers reseeds each layer's init, which a program does itself.
  s.accept({"pipe_partitioned", "grad_partitioned"});
  s.accept_only_default("seed_layers", false);
  s.finish();
  return c;
}

HybridEngineConfig parse_hybrid_engine(JsonReader& s) {
  HybridEngineConfig c;
  c.enabled = s.get_bool("enabled", false);
  c.max_out_tokens = s.get_int("max_out_tokens", 512, 1);
  c.pin_parameters = s.get_bool("pin_parameters", true);
  c.release_inference_cache = s.get_bool("release_inference_cache", false);
  c.tp_gather_partition_size = s.get_int("tp_gather_partition_size", 8, 1);
  c.inference_tp_size = s.get_int("inference_tp_size", 1, 1);
  // The sliced layers are cut from whole weights: under ZeRO-3 the ones gathered for the whole call.
  s.require(c.inference_tp_size == 1 || c.pin_parameters, "inference_tp_size",
            "1 when pin_parameters is false (generation through ZeRO-3's per-forward gathering has no whole weights "
            "to slice; keep pin_parameters true for a tensor-parallel generation layout)");
  s.accept_only_default("enable_cuda_graph", false);
  s.finish();
  return c;
}

}  // namespace

void parse_misc_sections(JsonReader& root, Config& config) {
  JsonReader pipeline = root.section("pipeline");
  config.pipeline = parse_pipeline(pipeline);
  JsonReader ac = root.section("activation_checkpointing");
  config.activation_checkpointing = parse_activation_checkpointing(ac);
  JsonReader tensorboard = root.section("tensorboard");
  config.tensorboard = parse_monitor(tensorboard, false);
  JsonReader csv = root.section("csv_monitor");
  config.csv_monitor = parse_monitor(csv, false);
  JsonReader wandb = root.section("wandb");
  config.wandb = parse_monitor(wandb, true);
  JsonReader flops = root.section("flops_profiler");
  config.flops_profiler = parse_flops_profiler(flops);
  JsonReader comms = root.section("comms_logger");
  config.comms_logger = parse_comms_logger(comms);
  JsonReader checkpoint = root.section("checkpoint");
  config.checkpoint = parse_checkpoint(checkpoint);
  JsonReader hybrid = root.section("hybrid_engine");
  config.hybrid_engine = parse_hybrid_engine(hybrid);
}

}  // namespace dscpp
