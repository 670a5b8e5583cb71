// "auto": HF Trainer arguments mapped onto dotted config paths (as HF's deepspeed integration does), the fill
// pass that runs before parsing, and the error for an "auto" nothing filled (fill or fail at load).
#include <cmath>
#include <utility>
#include <vector>

#include "dscpp/config/auto_fill.h"
#include "dscpp/config/config_error.h"

namespace dscpp {

const char* const kBatchKeys[3] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                   "gradient_accumulation_steps"};

AutoValues AutoValues::from_hf_args(const HfArgs& args) {
  AutoValues out;
  out.default_micro_batch = args.default_micro_batch;
  auto& v = out.values;
  if (args.micro_batch) v["train_micro_batch_size_per_gpu"] = *args.micro_batch;
  if (args.grad_accum) v["gradient_accumulation_steps"] = *args.grad_accum;
  if (args.world_size && args.micro_batch && args.grad_accum) {
    v["train_batch_size"] = *args.world_size * *args.micro_batch * *args.grad_accum;
  }
  if (args.max_grad_norm) v["gradient_clipping"] = *args.max_grad_norm;
  if (args.lr) {
    v["optimizer.params.lr"] = *args.lr;
    v["scheduler.params.warmup_max_lr"] = *args.lr;
  }
  if (args.weight_decay) v["optimizer.params.weight_decay"] = *args.weight_decay;
  // The HF Trainer always passes betas and eps (its defaults 0.9, 0.999, 1e-8); nobody sets them per run.
  v["optimizer.params.betas"] = {args.adam_beta1.value_or(0.9), args.adam_beta2.value_or(0.999)};
  v["optimizer.params.eps"] = args.adam_epsilon.value_or(1e-8);
  v["scheduler.params.warmup_min_lr"] = 0.0;  // HF fills it unconditionally
  if (args.warmup_steps) v["scheduler.params.warmup_num_steps"] = *args.warmup_steps;
  if (args.total_steps) v["scheduler.params.total_num_steps"] = *args.total_steps;
  // HF fills both from its two booleans: naming one precision says the other is off.
  if (args.fp16 || args.bf16) {
    v["fp16.enabled"] = args.fp16.value_or(false);
    v["bf16.enabled"] = args.bf16.value_or(false);
  }
  if (args.hidden_size) {
    const int64_t h = *args.hidden_size;
    v["zero_optimization.reduce_bucket_size"] = h * h;
    v["zero_optimization.stage3_prefetch_bucket_size"] = static_cast<int64_t>(std::floor(0.9 * h * h));
    v["zero_optimization.stage3_param_persistence_threshold"] = 10 * h;
  }
  return out;
}

void set_dotted(nlohmann::json& config, const std::string& path, const nlohmann::json& value) {
  nlohmann::json* node = &config;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string key = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (key.empty()) throw ConfigError("config override '" + path + "': empty key in the dotted path");
    if (!node->is_object()) {
      throw ConfigError("config override '" + path + "': '" + path.substr(0, start ? start - 1 : 0) +
                        "' is not an object");
    }
    if (dot == std::string::npos) {
      (*node)[key] = value;
      return;
    }
    if (!node->contains(key) || (*node)[key].is_null()) (*node)[key] = nlohmann::json::object();
    node = &(*node)[key];
    start = dot + 1;
  }
}

namespace {

bool is_auto(const nlohmann::json& value) { return value.is_string() && value.get<std::string>() == "auto"; }

void fill_recursive(nlohmann::json& node, const std::string& path, const AutoValues& auto_values) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    std::string child = path.empty() ? it.key() : path + "." + it.key();
    if (it->is_object()) {
      fill_recursive(*it, child, auto_values);
    } else if (is_auto(*it)) {
      auto found = auto_values.values.find(child);
      if (found != auto_values.values.end()) *it = found->second;
    }
  }
}

}  // namespace

void fill_auto(nlohmann::json& config, const AutoValues& auto_values) {
  bool batch_stated = false;
  for (const char* key : kBatchKeys) {
    if (config.contains(key) && config[key].is_number()) batch_stated = true;
  }
  if (!batch_stated) {
    for (const char* key : kBatchKeys) {
      auto found = auto_values.values.find(key);
      if (!config.contains(key) && found != auto_values.values.end()) config[key] = found->second;
    }
  }
  fill_recursive(config, "", auto_values);
  if (auto_values.default_micro_batch) {
    auto is_number = [&](const char* key) { return config.contains(key) && config[key].is_number(); };
    if (!is_number(kBatchKeys[0]) && !is_number(kBatchKeys[1])) {
      config[kBatchKeys[1]] = *auto_values.default_micro_batch;
    }
  }
}

std::string unfilled_auto_message(const std::string& path) {
  static const std::vector<std::pair<std::string, std::string>> kFlags = {
      {"optimizer.params.lr", "--lr"},
      {"optimizer.params.weight_decay", "--weight_decay"},
      {"optimizer.params.betas", "--adam_beta1/--adam_beta2"},
      {"optimizer.params.eps", "--adam_epsilon"},
      {"scheduler.params.warmup_max_lr", "--lr"},
      {"scheduler.params.warmup_num_steps", "--warmup_steps"},
      {"scheduler.params.total_num_steps", "--total_steps"},
      {"gradient_clipping", "--clip"},
      {"fp16.enabled", "--fp16 or --bf16"},
      {"bf16.enabled", "--fp16 or --bf16"},
      {"zero_optimization.reduce_bucket_size", "--hidden_size"},
      {"zero_optimization.stage3_prefetch_bucket_size", "--hidden_size"},
      {"zero_optimization.stage3_param_persistence_threshold", "--hidden_size"},
  };
  std::string message = path + " = \"auto\" but nothing filled it: pass --set " + path + "=VALUE";
  for (const auto& [key, flag] : kFlags) {
    if (key == path) message += " or the HF-style flag " + flag;
  }
  return message;
}

void check_no_auto_left(const nlohmann::json& config, const std::string& path) {
  for (auto it = config.begin(); it != config.end(); ++it) {
    std::string child = config.is_object() ? (path.empty() ? it.key() : path + "." + it.key()) : path;
    if (is_auto(*it)) throw ConfigError(unfilled_auto_message(child));
    if (it->is_structured()) check_no_auto_left(*it, child);
  }
}

}  // namespace dscpp
