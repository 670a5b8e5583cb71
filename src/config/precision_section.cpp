// "fp16", "bf16" and "communication_data_type": the compute dtype and the loss-scaler options.
#include "dscpp/config/config_error.h"
#include "dscpp/config/sections.h"

namespace dscpp {
namespace {

// A dtype name or null (absent: written out as null). DeepSpeed accepts its short and torch-style spellings;
// resolved keeps the short one.
std::optional<DType> read_dtype(JsonReader& section, const std::string& key) {
  static const std::vector<std::string> kDtypes = {"fp32", "float32", "fp16", "float16", "bf16", "bfloat16"};
  if (!section.has(key)) {
    section.get_optional_string(key);  // writes null
    return std::nullopt;
  }
  const std::string name = section.get_choice(key, "fp32", kDtypes);
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "fp16" || name == "float16") return DType::kFloat16;
  return DType::kBFloat16;
}

}  // namespace

void parse_precision(JsonReader& root, Config& config) {
  JsonReader fp16 = root.section("fp16");
  config.fp16.enabled = fp16.get_bool("enabled", false);
  config.fp16.auto_cast = fp16.get_bool("auto_cast", false);
  LossScalerOptions& s = config.fp16.scaler;
  s.static_scale = fp16.get_number("loss_scale", 0.0);
  fp16.require(s.static_scale >= 0, "loss_scale", "a number >= 0 (0 = dynamic loss scaling)");
  s.initial_scale_power = static_cast<int>(fp16.get_int("initial_scale_power", 16, 0, 1000));
  s.scale_window = fp16.get_int("loss_scale_window", 1000, 1);
  s.hysteresis = static_cast<int>(fp16.get_int("hysteresis", 2, 1, 1'000'000));
  s.consecutive_hysteresis = fp16.get_bool("consecutive_hysteresis", false);
  s.min_scale = fp16.get_number("min_loss_scale", 1.0);
  fp16.require(s.min_scale > 0, "min_loss_scale", "a number > 0");
  // Accepted DeepSpeed keys we do not act on (the engine keeps fp32 master weights regardless).
  fp16.accept_if_disabled({"fp16_master_weights_and_grads"});
  fp16.finish();

  // "bfloat16" was folded into "bf16" before parsing (Config::from_json).
  JsonReader bf16 = root.section("bf16");
  config.bf16 = bf16.get_bool("enabled", false);
  bf16.accept({"immediate_grad_update", "check_grad_overflow"});
  bf16.accept_only_default("bf16_master_weights_and_grads", false);
  bf16.accept_only_default("bf16_optimizer_states", false);
  bf16.finish();
  if (config.fp16.enabled && config.bf16) {
    throw ConfigError("fp16.enabled = true and bf16.enabled = true: enable at most one of fp16 and bf16");
  }

  config.communication_data_type = read_dtype(root, "communication_data_type");
  // With sequence_parallel_size > 1 DeepSpeed's engine replaces the gradients' communication dtype by this one
  // (engine.py: communication_data_type = seq_parallel_communication_data_type), fp32 unless the config says.
  config.seq_parallel_communication_data_type =
      read_dtype(root, "seq_parallel_communication_data_type").value_or(DType::kFloat32);
}

void parse_data_types(JsonReader& root, Config& config) {
  JsonReader data_types = root.section("data_types");
  config.grad_accum_dtype = read_dtype(data_types, "grad_accum_dtype");  // checked by check_supported
  // DeepSpeed requires param_dtype to name the fp16/bf16 mode's dtype, and casts buffers to buffer_dtype.
  if (auto param = read_dtype(data_types, "param_dtype")) {
    data_types.require(*param == config.compute_dtype(), "param_dtype",
                       "\"" + to_string(config.compute_dtype()) + "\", the dtype fp16/bf16 select");
  }
  data_types.accept_only_default("buffer_dtype", nullptr);
  data_types.finish();
}

}  // namespace dscpp
