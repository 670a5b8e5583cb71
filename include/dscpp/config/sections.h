// Section parsers: each turns one object of the DeepSpeed JSON into its typed struct (internal to the config layer).
#pragma once

#include <optional>

#include "dscpp/config/config.h"
#include "dscpp/config/json_reader.h"

namespace dscpp {

// "fp16", "bf16" (alias "bfloat16", folded before parsing) and "communication_data_type" of the root.
void parse_precision(JsonReader& root, Config& config);
// "data_types": grad_accum_dtype (nullopt: unset) and the checks of param_dtype / buffer_dtype.
void parse_data_types(JsonReader& root, Config& config);
// "zero_optimization" and "aio".
ZeroConfig parse_zero(JsonReader& section);
AioConfig parse_aio(JsonReader& section);
// "optimizer": nullopt when the section is absent (the program brings its own optimizer).
std::optional<OptimizerConfig> parse_optimizer(JsonReader& root);
// "scheduler": nullopt when absent (constant lr).
std::optional<SchedulerConfig> parse_scheduler(JsonReader& root);
// activation_checkpointing, tensorboard, csv_monitor, wandb, flops_profiler, comms_logger, checkpoint.
void parse_misc_sections(JsonReader& root, Config& config);

}  // namespace dscpp
