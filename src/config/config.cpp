// Config::from_json: overrides, aliases and "auto" first, then every section parsed and validated in one pass,
// leaving `resolved` as the fully written-out document (SPEC §2).
#include "dscpp/config/config.h"

#include <fstream>
#include <sstream>

#include "dscpp/config/auto_fill.h"
#include "dscpp/config/json_reader.h"
#include "dscpp/config/sections.h"

namespace dscpp {
namespace {

// DeepSpeed's older spellings, folded into the current ones so the rest of the parser sees one name.
void normalize_aliases(nlohmann::json& doc) {
  if (doc.contains("bfloat16")) {
    if (doc.contains("bf16")) {
      throw ConfigError("bfloat16 = " + doc["bfloat16"].dump() + ": \"bfloat16\" is an alias of \"bf16\", which "
                        "is also given; keep one of them");
    }
    doc["bf16"] = doc["bfloat16"];
    doc.erase("bfloat16");
  }
  auto zero = doc.find("zero_optimization");
  if (zero != doc.end() && zero->is_object() && zero->value("cpu_offload", nlohmann::json()) == true) {
    auto& offload = (*zero)["offload_optimizer"];
    if (offload.is_null()) offload = nlohmann::json::object();
    if (offload.is_object() && !offload.contains("device")) offload["device"] = "cpu";
  }
}

void parse_batch(JsonReader& root, nlohmann::json& doc, int world_size, Config& config) {
  // A batch key still "auto" after filling is simply unknown: the triangle solves it if it can.
  for (const char* key : kBatchKeys) {
    if (doc.contains(key) && doc[key] == "auto") doc.erase(key);
  }
  auto train = root.get_optional_int(kBatchKeys[0]);
  auto micro = root.get_optional_int(kBatchKeys[1]);
  auto accum = root.get_optional_int(kBatchKeys[2]);
  config.batch = resolve_batch(train, micro, accum, world_size);
  doc[kBatchKeys[0]] = config.batch.train_batch_size;
  doc[kBatchKeys[1]] = config.batch.micro_batch;
  doc[kBatchKeys[2]] = config.batch.grad_accum;
}

}  // namespace

std::string to_string(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
  }
  return "unknown";
}

DType Config::compute_dtype() const {
  if (fp16.enabled) return DType::kFloat16;
  if (bf16) return DType::kBFloat16;
  return DType::kFloat32;
}

Config Config::from_json(const nlohmann::json& input, const ConfigOptions& options) {
  if (!input.is_object()) throw ConfigError("config: expected a JSON object {...}, got " + input.dump());
  nlohmann::json doc = input;
  normalize_aliases(doc);
  for (const auto& [path, value] : options.overrides) {
    const bool alias = path.rfind("bfloat16.", 0) == 0;
    set_dotted(doc, alias ? "bf16" + path.substr(8) : path, value);
  }
  fill_auto(doc, options.auto_values);

  ParseContext context(options.warn);
  JsonReader root(doc, "", context);
  Config config;
  parse_batch(root, doc, options.world_size, config);
  config.gradient_clipping = root.get_number("gradient_clipping", 0.0);
  root.require(config.gradient_clipping >= 0, "gradient_clipping", "a number >= 0 (0 = no clipping)");
  config.steps_per_print = root.get_int("steps_per_print", 10, 1);
  config.wall_clock_breakdown = root.get_bool("wall_clock_breakdown", false);
  config.memory_breakdown = root.get_bool("memory_breakdown", false);
  config.prescale_gradients = root.get_bool("prescale_gradients", false);
  config.gradient_predivide_factor = root.get_number("gradient_predivide_factor", 1.0);
  root.require(config.gradient_predivide_factor > 0, "gradient_predivide_factor", "a number > 0");
  parse_precision(root, config);
  config.optimizer = parse_optimizer(root);
  config.scheduler = parse_scheduler(root);
  JsonReader zero = root.section("zero_optimization");
  config.zero = parse_zero(zero);
  JsonReader aio = root.section("aio");
  config.aio = parse_aio(aio);
  parse_misc_sections(root, config);
  // Top-level DeepSpeed keys that change nothing here (tuning knobs and switches of other engines): accepted.
  root.accept({"zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "dump_state", "disable_allgather",
               "data_types", "pipeline", "dataloader_drop_last", "timers", "seq_parallel_communication_data_type",
               "use_data_before_expert_parallelism", "graph_harvesting", "checkpoint_parallel_write_pipeline"});
  // DeepSpeed features this engine does not have: fine while off, an error when switched on.
  root.accept_if_disabled({"amp", "sparse_gradients", "elasticity", "compression_training", "data_efficiency",
                           "curriculum_learning", "autotuning", "nebula", "sparse_attention", "eigenvalue",
                           "progressive_layer_drop", "quantize_training", "hybrid_engine", "compile",
                           "weight_quantization", "tensor_parallel"});
  root.finish();
  check_no_auto_left(doc);
  config.resolved = std::move(doc);
  return config;
}

Config Config::from_string(const std::string& text, const ConfigOptions& options) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(std::string("config is not valid JSON: ") + e.what());
  }
  return from_json(json, options);
}

Config Config::from_file(const std::string& path, const ConfigOptions& options) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the config file");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return from_string(text.str(), options);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

}  // namespace dscpp
