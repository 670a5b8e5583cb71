// "scheduler": {type, params} parsed into schedule/options.h with DeepSpeed's defaults.
#include "dscpp/config/config_error.h"
#include "dscpp/config/sections.h"

namespace dscpp {
namespace {

WarmupType read_warmup_type(JsonReader& p) {
  return p.get_choice("warmup_type", "log", {"log", "linear"}) == "log" ? WarmupType::kLog : WarmupType::kLinear;
}

// `default_max_lr`: WarmupLR has none (it warms up to the optimizer's lr); WarmupDecayLR's is 1e-3, as DeepSpeed's.
WarmupLROptions parse_warmup(JsonReader& p, std::optional<double> default_max_lr) {
  WarmupLROptions o;
  o.warmup_min_lr = p.get_number("warmup_min_lr", 0.0);
  p.require(o.warmup_min_lr >= 0, "warmup_min_lr", "a number >= 0");
  if (p.has("warmup_max_lr") || default_max_lr) {
    o.warmup_max_lr = p.get_number("warmup_max_lr", default_max_lr.value_or(0.0));
    p.require(*o.warmup_max_lr >= 0, "warmup_max_lr", "a number >= 0");
  }
  o.warmup_num_steps = p.get_int("warmup_num_steps", 1000, 1, JsonReader::kNoMax);  // DeepSpeed: a positive integer
  o.warmup_type = read_warmup_type(p);
  return o;
}

// total_num_steps is required where it appears: the decay has no sensible default length.
int64_t read_total_steps(JsonReader& p, int64_t warmup_num_steps) {
  p.require(p.has("total_num_steps"), "total_num_steps", "an integer >= warmup_num_steps (required)");
  int64_t total = p.get_int("total_num_steps", 0, 1, JsonReader::kNoMax);
  p.require(total >= warmup_num_steps, "total_num_steps",
            "an integer >= warmup_num_steps (" + std::to_string(warmup_num_steps) + ")");
  return total;
}

WarmupDecayLROptions parse_warmup_decay(JsonReader& p) {
  WarmupDecayLROptions o;
  o.warmup = parse_warmup(p, 1e-3);
  o.total_num_steps = read_total_steps(p, o.warmup.warmup_num_steps);
  return o;
}

WarmupCosineLROptions parse_warmup_cosine(JsonReader& p) {
  WarmupCosineLROptions o;
  o.warmup_min_ratio = p.get_number("warmup_min_ratio", 0.0);
  p.require(o.warmup_min_ratio >= 0 && o.warmup_min_ratio <= 1, "warmup_min_ratio", "a number in [0, 1]");
  o.warmup_num_steps = p.get_int("warmup_num_steps", 1000, 1, JsonReader::kNoMax);  // DeepSpeed: a positive integer
  o.cos_min_ratio = p.get_number("cos_min_ratio", 1e-4);
  p.require(o.cos_min_ratio >= 0 && o.cos_min_ratio <= 1, "cos_min_ratio", "a number in [0, 1]");
  o.warmup_type = read_warmup_type(p);
  o.total_num_steps = read_total_steps(p, o.warmup_num_steps);
  return o;
}

// null means "same as the first half" in DeepSpeed; we spell that -1.
int64_t read_optional_steps(JsonReader& p, const std::string& key) {
  return p.get_optional_int(key, 0, JsonReader::kNoMax).value_or(-1);
}

OneCycleOptions parse_one_cycle(JsonReader& p) {
  OneCycleOptions o;
  p.require(p.has("cycle_min_lr"), "cycle_min_lr", "a number (required by OneCycle)");
  p.require(p.has("cycle_max_lr"), "cycle_max_lr", "a number (required by OneCycle)");
  o.cycle_min_lr = p.get_number("cycle_min_lr", 0.0);
  o.cycle_max_lr = p.get_number("cycle_max_lr", 0.0);
  p.require(o.cycle_min_lr >= 0 && o.cycle_min_lr <= o.cycle_max_lr, "cycle_min_lr",
            "a number in [0, cycle_max_lr]");
  o.decay_lr_rate = p.get_number("decay_lr_rate", 0.0);
  o.cycle_first_step_size = p.get_int("cycle_first_step_size", 2000, 1, JsonReader::kNoMax);
  o.cycle_second_step_size = read_optional_steps(p, "cycle_second_step_size");
  o.cycle_first_stair_count = p.get_int("cycle_first_stair_count", 0, 0, JsonReader::kNoMax);
  o.cycle_second_stair_count = read_optional_steps(p, "cycle_second_stair_count");
  o.decay_step_size = p.get_int("decay_step_size", 0, 0, JsonReader::kNoMax);
  o.cycle_momentum = p.get_bool("cycle_momentum", true);
  o.cycle_min_mom = p.get_number("cycle_min_mom", 0.8);
  o.cycle_max_mom = p.get_number("cycle_max_mom", 0.9);
  o.decay_mom_rate = p.get_number("decay_mom_rate", 0.0);
  return o;
}

LRRangeTestOptions parse_lr_range_test(JsonReader& p) {
  LRRangeTestOptions o;
  o.lr_range_test_min_lr = p.get_number("lr_range_test_min_lr", 1e-3);
  p.require(o.lr_range_test_min_lr >= 0, "lr_range_test_min_lr", "a number >= 0");
  o.lr_range_test_step_size = p.get_int("lr_range_test_step_size", 2000, 1, JsonReader::kNoMax);
  o.lr_range_test_step_rate = p.get_number("lr_range_test_step_rate", 1.0);
  o.lr_range_test_staircase = p.get_bool("lr_range_test_staircase", false);
  return o;
}

}  // namespace

std::optional<SchedulerConfig> parse_scheduler(JsonReader& root) {
  if (!root.has("scheduler")) {
    root.accept({"scheduler"});
    return std::nullopt;
  }
  JsonReader section = root.section("scheduler");
  static const std::vector<std::string> kTypes = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle",
                                                  "LRRangeTest"};
  section.require(section.has("type"), "type", "one of WarmupLR|WarmupDecayLR|WarmupCosineLR|OneCycle|LRRangeTest");
  SchedulerConfig config;
  config.type = section.get_choice("type", "", kTypes);
  JsonReader params = section.section("params");
  if (config.type == "WarmupLR") {
    config.options = parse_warmup(params, std::nullopt);
  } else if (config.type == "WarmupDecayLR") {
    config.options = parse_warmup_decay(params);
  } else if (config.type == "WarmupCosineLR") {
    config.options = parse_warmup_cosine(params);
  } else if (config.type == "OneCycle") {
    config.options = parse_one_cycle(params);
  } else {
    config.options = parse_lr_range_test(params);
  }
  // DeepSpeed's resume hook; our schedules are functions of the step count (restored from the checkpoint).
  params.accept({"last_batch_iteration"});
  params.finish();
  section.finish();
  return config;
}

}  // namespace dscpp
