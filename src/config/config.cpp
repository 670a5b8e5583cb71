// Config::from_json: overrides, aliases and "auto" first, then every section parsed and validated in one pass,
// leaving `resolved` as the fully written-out document.
#include "dscpp/config/config.h"

#include <fstream>
#include <sstream>

#include "dscpp/config/auto_fill.h"
#include "dscpp/config/json_reader.h"
#include "dscpp/config/sections.h"
#include "dscpp/config/support.h"

namespace dscpp {
namespace {

// DeepSpeed's older spellings, folded into the current ones so the rest of the parser sees one name.
void normalize_bf16_alias(nlohmann::json& doc) {
  if (doc.contains("bfloat16")) {
    if (doc.contains("bf16")) {
      throw ConfigError("bfloat16 = " + doc["bfloat16"].dump() + ": \"bfloat16\" is an alias of \"bf16\", which "
                        "is also given; keep one of them");
    }
    doc["bf16"] = doc["bfloat16"];
    doc.erase("bfloat16");
  }
}

// After the overrides, so `--set zero_optimization.cpu_offload=true` works as written in the file would.
void normalize_legacy_offload(nlohmann::json& doc) {
  // ZeRO's legacy switches, as DeepSpeed maps them: cpu_offload → offload_optimizer on the CPU, cpu_offload_param(s)
  // → offload_param on the CPU. (DeepSpeed only warns about cpu_offload_use_pin_memory and applies nothing.)
  auto zero = doc.find("zero_optimization");
  if (zero == doc.end() || !zero->is_object()) return;
  auto legacy = [&](const char* key, const char* section) {
    if (zero->value(key, nlohmann::json()) != true) return;
    auto& offload = (*zero)[section];
    if (offload.is_null()) offload = nlohmann::json::object();
    if (offload.is_object() && !offload.contains("device")) offload["device"] = "cpu";
  };
  legacy("cpu_offload", "offload_optimizer");
  legacy("cpu_offload_param", "offload_param");
  legacy("cpu_offload_params", "offload_param");
}

void normalize_zero_aliases(nlohmann::json& doc) {
  // DeepSpeed's ZeRO model names these fields without "stage3_" and takes the stage3_ spelling as the alias; both are
  // accepted, one at a time. Here the stage3_ name is the one the config resolves to (and "auto" fills).
  auto zero = doc.find("zero_optimization");
  if (zero == doc.end() || !zero->is_object()) return;
  for (const char* field : {"prefetch_bucket_size", "param_persistence_threshold", "model_persistence_threshold",
                            "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
                            "module_granularity_threshold", "use_all_reduce_for_fetch_params"}) {
    auto it = zero->find(field);
    if (it == zero->end()) continue;
    const std::string alias = std::string("stage3_") + field;
    if (zero->contains(alias)) {
      throw ConfigError(std::string("zero_optimization.") + field + " = " + it->dump() + ": DeepSpeed's other name for "
                        "zero_optimization." + alias + ", which is also given; keep one of them");
    }
    (*zero)[alias] = *it;
    zero->erase(it);
  }
}

void parse_batch(JsonReader& root, nlohmann::json& doc, int world_size, Config& config) {
  // A batch key still "auto" after filling is simply unknown: the triangle solves it if it can, and if it cannot
  // the error says which keys were "auto" and how to fill them.
  std::vector<std::string> autos;
  for (const char* key : kBatchKeys) {
    if (doc.contains(key) && doc[key] == "auto") {
      doc.erase(key);
      autos.push_back(key);
    }
  }
  auto train = root.get_optional_int(kBatchKeys[0]);
  auto micro = root.get_optional_int(kBatchKeys[1]);
  auto accum = root.get_optional_int(kBatchKeys[2]);
  try {
    config.batch = resolve_batch(train, micro, accum, world_size);
  } catch (const ConfigError& e) {
    if (autos.empty()) throw;
    std::string message = e.what();
    for (const auto& key : autos) {
      const size_t at = message.find(key + "=unset");
      if (at != std::string::npos) message.replace(at, key.size() + 6, key + "=\"auto\"");
    }
    throw ConfigError(message + "; \"auto\" batch sizes are filled by the program (HF-style --micro_batch and "
                      "--grad_accum) or with --set train_micro_batch_size_per_gpu=N");
  }
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
  normalize_bf16_alias(doc);
  for (const auto& [path, value] : options.overrides) {
    const bool alias = path.rfind("bfloat16.", 0) == 0;
    set_dotted(doc, alias ? "bf16" + path.substr(8) : path, value);
  }
  normalize_legacy_offload(doc);
  normalize_zero_aliases(doc);
  // DeepSpeed's default "stages": "auto" leaves the count to the program's PipelineModule; here that is the default.
  if (doc.contains("pipeline") && doc["pipeline"].is_object() &&
      doc["pipeline"].value("stages", nlohmann::json()) == "auto") {
    doc["pipeline"].erase("stages");
  }
  fill_auto(doc, options.auto_values);

  ParseContext context(options.warn);
  JsonReader root(doc, "", context);
  Config config;
  parse_batch(root, doc, options.world_size, config);
  // DeepSpeed 0.19.8's default (GRADIENT_CLIPPING_DEFAULT = 1.0): a config without the key clips at 1.0.
  config.gradient_clipping = root.get_number("gradient_clipping", 1.0);
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
  config.sequence_parallel_size = static_cast<int>(root.get_int("sequence_parallel_size", 1, 1));
  parse_data_types(root, config);
  // Top-level DeepSpeed keys that change nothing in this engine; tests/config/key_table_test.cpp gives each reason.
  root.accept({"zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "dataloader_drop_last", "timers",
               "use_data_before_expert_parallelism", "checkpoint_parallel_write_pipeline", "vocabulary_size",
               "log_level"});
  root.accept_only_default("dump_state", false);
  root.accept_only_default("managed_gradient_accumulation", true);
  root.accept_only_default("gradient_allreduce_op", "mean");
  root.accept_only_default("datastates_ckpt", false);
  root.accept_only_default("disable_allgather", false);
  root.accept_only_default("graph_harvesting", false);
  // DeepSpeed acts on random-LTD when its own switch is on, whatever data_efficiency.enabled says (engine.py reads
  // random_ltd.enabled alone), so the section's switch being off does not make it harmless.
  const nlohmann::json::json_pointer random_ltd("/data_efficiency/data_routing/random_ltd/enabled");
  if (doc.contains(random_ltd) && doc[random_ltd] == true) {
    throw ConfigError("data_efficiency.data_routing.random_ltd.enabled = true: DeepSpeed trains with random-LTD "
                      "whenever this is true, even with data_efficiency.enabled false; it is not supported yet by "
                      "deepspeed.cpp; remove the key or set it false");
  }
  // DeepSpeed features this engine does not have: fine while off, an error when switched on.
  // Only when present, so that a config without it resolves without DeepSpeed Compression's many defaults.
  if (root.has("compression_training")) {
    JsonReader compression = root.section("compression_training");
    config.compression = parse_compression(compression);
  }
  root.accept_if_disabled({"amp", "sparse_gradients", "elasticity", "data_efficiency",
                           "curriculum_learning", "autotuning", "nebula", "eigenvalue", "progressive_layer_drop",
                           "quantize_training", "compile", "weight_quantization", "comet",
                           "torch_autocast"});
  // A DeepSpeed switch without an "enabled" key: sparse attention is on once its section is there.
  if (root.has("sparse_attention")) {
    JsonReader sparse = root.section("sparse_attention");
    config.sparse_attention = parse_sparse_attention(sparse);
  }
  if (root.has("tensor_parallel")) {
    JsonReader tp = root.section("tensor_parallel");
    const int64_t size = tp.get_int("autotp_size", 0, 0);
    config.tensor_parallel_size = static_cast<int>(std::max<int64_t>(size, 1));
    tp.accept({"preset_model", "tp_overlap_comm", "partition_config", "dtype", "tp", "injection_policy_tuple",
               "keep_module_on_host", "kernel_inject"});
    tp.finish();
  }
  root.finish();
  check_no_auto_left(doc);
  config.resolved = std::move(doc);
  check_supported(config);
  return config;
}

Config Config::from_string(const std::string& text, const ConfigOptions& options, const std::string& source) {
  try {
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw ConfigError(std::string("config is not valid JSON: ") + e.what());
    }
    return from_json(json, options);
  } catch (const ConfigError& e) {
    if (source.empty()) throw;
    throw ConfigError(source + ": " + e.what());
  }
}

std::string Config::read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path + ": cannot open the config file");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Config Config::from_file(const std::string& path, const ConfigOptions& options) {
  return from_string(read_file(path), options, path);
}

ParallelSizes read_parallel_sizes(const nlohmann::json& config,
                                    const std::map<std::string, nlohmann::json>& overrides) {
  auto size = [&](const std::string& section, const std::string& key) {
    nlohmann::json value = 1;
    if (config.is_object() && config.contains(section) && config[section].is_object()) {
      value = config[section].value(key, value);
    }
    if (const auto set = overrides.find(section + "." + key); set != overrides.end()) value = set->second;
    return value.is_number_integer() ? std::max(1, value.get<int>()) : 1;
  };
  nlohmann::json sequence = 1;
  if (config.is_object()) sequence = config.value("sequence_parallel_size", sequence);
  if (const auto set = overrides.find("sequence_parallel_size"); set != overrides.end()) sequence = set->second;
  return {size("tensor_parallel", "autotp_size"), size("pipeline", "stages"),
          sequence.is_number_integer() ? std::max(1, sequence.get<int>()) : 1};
}

}  // namespace dscpp
