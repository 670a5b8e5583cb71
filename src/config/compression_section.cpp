// "compression_training": DeepSpeed Compression's keys (deepspeed/compression/constants.py of the releases that had
// it), each read, checked and written out with its default. Where DeepSpeed would fail later with an assert or a
// KeyError (a missing "params", "*" as a module pattern, l1 head pruning), the parse stops naming the key instead.
#include "dscpp/config/compression.h"

#include <algorithm>
#include <string>

#include "dscpp/config/config_error.h"
#include "dscpp/config/json_reader.h"

namespace dscpp {
namespace {

enum class Technique { kWeight, kActivation, kSparse, kRow, kHead, kChannel };

std::vector<std::string> regex_list(JsonReader& group, const nlohmann::json* value, const std::string& key) {
  const std::string what = "a list of regular expressions searched in the model's module names";
  if (value == nullptr || !value->is_array() || value->empty()) group.fail(key, what);
  std::vector<std::string> out;
  for (const auto& item : *value) {
    if (!item.is_string() || item.get<std::string>().empty()) group.fail(key, what);
    out.push_back(item.get<std::string>());
  }
  return out;
}

CompressionGroup parse_group(JsonReader& group, const std::string& name, Technique technique) {
  CompressionGroup g;
  g.name = name;
  g.modules = regex_list(group, group.raw("modules"), "modules");
  const nlohmann::json* related = group.raw("related_modules");
  if (related != nullptr && !related->is_null()) {
    const std::string what = "null, or one list of regular expressions per entry of modules (" +
                             std::to_string(g.modules.size()) + ")";
    if (!related->is_array() || related->size() != g.modules.size()) group.fail("related_modules", what);
    for (const auto& entry : *related) {
      if (!entry.is_array()) group.fail("related_modules", what);
      std::vector<std::string> patterns;
      for (const auto& item : entry) {
        if (!item.is_string()) group.fail("related_modules", what);
        patterns.push_back(item.get<std::string>());
      }
      g.related_modules.push_back(patterns);
    }
    group.require(technique == Technique::kRow || technique == Technique::kHead || technique == Technique::kChannel,
                  "related_modules", "null: only row, head and channel pruning shrink related modules");
  }
  if (!group.has("params")) group.fail("params", "an object of the group's parameters");
  JsonReader params = group.section("params");
  switch (technique) {
    case Technique::kWeight: {
      if (!params.has("start_bits")) params.fail("start_bits", "the bits training starts at, 1 to 16");
      if (!params.has("target_bits")) params.fail("target_bits", "the bits training ends at, 1 to 16");
      g.start_bits = static_cast<int>(params.get_int("start_bits", 8, 1, 16));
      g.target_bits = static_cast<int>(params.get_int("target_bits", 8, 1, 16));
      // 0: MoQ drops a bit at every quantization until the target (DeepSpeedExamples' recipes use it).
      g.quantization_period = params.get_int("quantization_period", 1, 0);
      break;
    }
    case Technique::kActivation:
      if (!params.has("bits")) params.fail("bits", "4 or 8");
      g.bits = static_cast<int>(params.get_int("bits", 8, 4, 8));
      params.require(g.bits == 4 || g.bits == 8, "bits", "4 or 8 (DeepSpeed quantizes activations to these only)");
      break;
    default:
      if (!params.has("dense_ratio")) params.fail("dense_ratio", "the fraction kept, in (0, 1]");
      g.dense_ratio = params.get_number("dense_ratio", 1.0);
      params.require(g.dense_ratio > 0.0 && g.dense_ratio <= 1.0, "dense_ratio", "the fraction kept, in (0, 1]");
      break;
  }
  params.finish();
  group.finish();
  return g;
}

CompressionTechnique parse_technique(JsonReader& parent, const std::string& key, Technique technique,
                                     CompressionConfig& config) {
  static const std::vector<std::string> kTypes = {"symmetric", "asymmetric"};
  CompressionTechnique t;
  JsonReader section = parent.section(key);
  JsonReader shared = section.section("shared_parameters");
  t.enabled = shared.get_bool("enabled", false);
  switch (technique) {
    case Technique::kWeight:
      t.schedule_offset = shared.get_int("schedule_offset", 0, 0);
      t.quantization_type = shared.get_choice("quantization_type", "symmetric", kTypes);
      config.quantize_weight_in_forward = shared.get_bool("quantize_weight_in_forward", false);
      config.quantize_groups = shared.get_int("quantize_groups", 1, 1);
      config.quantize_verbose = shared.get_bool("quantize_verbose", false);
      config.rounding = shared.get_choice("rounding", "nearest", {"nearest", "stochastic"});
      // DeepSpeed's CUDA quantizer kernel (MoQ) rounds stochastically whatever `rounding` says, and its own way.
      shared.accept_only_default("quantizer_kernel", false);
      if (shared.has("fp16_mixed_quantize")) {
        JsonReader mixed = shared.section("fp16_mixed_quantize");
        config.fp16_mixed_quantize = mixed.get_bool("enabled", false);
        config.quantize_change_ratio = mixed.get_number("quantize_change_ratio", 0.001);
        mixed.require(config.quantize_change_ratio > 0.0 && config.quantize_change_ratio <= 1.0,
                      "quantize_change_ratio", "in (0, 1]");
        mixed.finish();
      }
      break;
    case Technique::kActivation:
      t.schedule_offset = shared.get_int("schedule_offset", 1000, 0);
      t.quantization_type = shared.get_choice("quantization_type", "symmetric", kTypes);
      t.range_calibration = shared.get_choice("range_calibration", "dynamic", {"dynamic", "static"});
      break;
    case Technique::kSparse: {
      t.method = shared.get_choice("method", "l1", {"l1", "topk", "snip_momentum"});
      shared.require(!t.enabled || t.method != "snip_momentum", "method",
                     "l1 or topk (snip_momentum runs Intel Neural Compressor's pruners, which deepspeed.cpp does "
                     "not have)");
      t.schedule_offset = shared.get_int("schedule_offset", 1000, 0);
      // snip_momentum's own settings (its pruning window and pattern): DeepSpeed reads them for that method only, so
      // they change nothing with l1 / topk, whose masks switch on at schedule_offset and stay on.
      shared.accept({"block_pattern", "schedule_offset_stride", "schedule_offset_end", "excluded_modules",
                     "dense_ratio"});
      break;
    }
    case Technique::kHead:
      t.method = shared.get_choice("method", "topk", {"topk", "l1"});
      shared.require(!t.enabled || t.method == "topk", "method",
                     "topk (DeepSpeed lists l1 but its head pruning has only learned scores: NotImplementedError)");
      t.schedule_offset = shared.get_int("schedule_offset", 1000, 0);
      if (t.enabled && !shared.has("num_heads")) shared.fail("num_heads", "the attention's head count");
      t.num_heads = static_cast<int>(shared.get_int("num_heads", 0, t.enabled ? 1 : 0));
      break;
    default:  // row and channel pruning
      t.method = shared.get_choice("method", "l1", {"l1", "topk"});
      t.schedule_offset = shared.get_int("schedule_offset", 1000, 0);
      break;
  }
  shared.finish();
  if (t.enabled && !section.has("different_groups")) {
    section.fail("different_groups", "the groups of modules it applies to, while shared_parameters.enabled is true");
  }
  JsonReader groups = section.section("different_groups");
  for (const auto& name : groups.keys()) {
    JsonReader group = groups.section(name);
    t.groups.push_back(parse_group(group, name, technique));
  }
  groups.finish();
  section.finish();
  // The ternary and binary quantizers have one sign-magnitude form only, and no stochastic rounding (DeepSpeed asserts
  // both where it reaches them).
  if (technique == Technique::kWeight && t.enabled) {
    for (const auto& g : t.groups) {
      const int lowest = config.quantize_weight_in_forward ? g.target_bits : std::min(g.start_bits, g.target_bits);
      if (!config.quantize_weight_in_forward && g.start_bits < g.target_bits) {
        throw ConfigError(shared.path_of("quantize_weight_in_forward") + " = false (MoQ): group '" + g.name +
                          "' has start_bits " + std::to_string(g.start_bits) + " below target_bits " +
                          std::to_string(g.target_bits) + "; MoQ only lowers the bits");
      }
      if (lowest > 2) continue;
      if (t.quantization_type != "symmetric") {
        throw ConfigError(shared.path_of("quantization_type") + " = \"" + t.quantization_type + "\": group '" +
                          g.name + "' goes down to " + std::to_string(lowest) +
                          " bits, which only symmetric quantization has (ternary / binary weights)");
      }
      if (!config.quantize_weight_in_forward && config.rounding != "nearest") {
        throw ConfigError(shared.path_of("rounding") + " = \"stochastic\": group '" + g.name + "' goes down to " +
                          std::to_string(lowest) + " bits, where MoQ rounds to nearest only");
      }
    }
  }
  return t;
}

LayerReductionConfig parse_layer_reduction(JsonReader& section) {
  LayerReductionConfig c;
  c.enabled = section.get_bool("enabled", false);
  if (c.enabled && !section.has("module_name_prefix")) {
    section.fail("module_name_prefix", "the name of the module holding the layers (\"transformer.h\")");
  }
  c.module_name_prefix = section.get_string("module_name_prefix", "");
  const nlohmann::json* teacher = section.raw("teacher_layer");
  if (teacher != nullptr && !teacher->is_null()) {
    if (!teacher->is_array()) section.fail("teacher_layer", "a list of the teacher's layer indices");
    for (const auto& item : *teacher) {
      if (!item.is_number_integer() || item.get<int64_t>() < 0) {
        section.fail("teacher_layer", "a list of the teacher's layer indices");
      }
      c.teacher_layer.push_back(item.get<int64_t>());
    }
  } else if (c.enabled) {
    section.fail("teacher_layer", "a list of the teacher's layer indices, one per student layer");
  }
  c.keep_number_layer = section.get_int("keep_number_layer", static_cast<int64_t>(c.teacher_layer.size()), 0);
  section.require(!c.enabled || c.keep_number_layer == static_cast<int64_t>(c.teacher_layer.size()),
                  "keep_number_layer",
                  "the length of teacher_layer (" + std::to_string(c.teacher_layer.size()) +
                      "): each kept student layer takes one teacher layer");
  const nlohmann::json* others = section.raw("other_module_name");
  if (others != nullptr && !others->is_null()) {
    if (!others->is_array()) section.fail("other_module_name", "a list of module names");
    for (const auto& item : *others) {
      if (!item.is_string()) section.fail("other_module_name", "a list of module names");
      c.other_module_name.push_back(item.get<std::string>());
    }
  }
  section.finish();
  return c;
}

}  // namespace

bool CompressionConfig::any_enabled() const {
  return weight_quantization.enabled || activation_quantization.enabled || sparse_pruning.enabled ||
         row_pruning.enabled || head_pruning.enabled || channel_pruning.enabled || layer_reduction.enabled;
}

CompressionConfig parse_compression(JsonReader& section) {
  CompressionConfig c;
  c.weight_quantization = parse_technique(section, "weight_quantization", Technique::kWeight, c);
  c.activation_quantization = parse_technique(section, "activation_quantization", Technique::kActivation, c);
  c.sparse_pruning = parse_technique(section, "sparse_pruning", Technique::kSparse, c);
  c.row_pruning = parse_technique(section, "row_pruning", Technique::kRow, c);
  c.head_pruning = parse_technique(section, "head_pruning", Technique::kHead, c);
  c.channel_pruning = parse_technique(section, "channel_pruning", Technique::kChannel, c);
  JsonReader layers = section.section("layer_reduction");
  c.layer_reduction = parse_layer_reduction(layers);
  section.finish();
  return c;
}

}  // namespace dscpp
