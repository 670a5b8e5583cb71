// "fp16", "bf16" and "communication_data_type": the compute dtype and the loss-scaler options (SPEC §2, §3.3).
#include "dscpp/config/config_error.h"
#include "dscpp/config/sections.h"

namespace dscpp {

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
  bf16.finish();
  if (config.fp16.enabled && config.bf16) {
    throw ConfigError("fp16.enabled = true and bf16.enabled = true: enable at most one of fp16 and bf16");
  }

  // DeepSpeed accepts both its short and torch-style spellings; resolved keeps the short one.
  static const std::vector<std::string> kDtypes = {"fp32", "float32", "fp16", "float16", "bf16", "bfloat16"};
  if (root.has("communication_data_type")) {
    std::string name = root.get_choice("communication_data_type", "fp32", kDtypes);
    if (name == "fp32" || name == "float32") {
      config.communication_data_type = DType::kFloat32;
    } else if (name == "fp16" || name == "float16") {
      config.communication_data_type = DType::kFloat16;
    } else {
      config.communication_data_type = DType::kBFloat16;
    }
  } else {
    root.get_optional_string("communication_data_type");  // writes null: "the compute dtype"
  }
}

}  // namespace dscpp
