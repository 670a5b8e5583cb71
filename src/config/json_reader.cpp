// JsonReader: typed, path-tracking reads of one config object, and the unknown-key warnings.
#include "dscpp/config/json_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iostream>
#include <utility>

#include "dscpp/config/auto_fill.h"
#include "dscpp/config/config_error.h"
#include "dscpp/config/known_keys.h"

namespace dscpp {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string int_range(int64_t min, int64_t max) {
  if (min == JsonReader::kNoMin && max == JsonReader::kNoMax) return "an integer";
  if (max == JsonReader::kNoMax) return "an integer >= " + std::to_string(min);
  if (min == JsonReader::kNoMin) return "an integer <= " + std::to_string(max);
  return "an integer in " + std::to_string(min) + ".." + std::to_string(max);
}

}  // namespace

ParseContext::ParseContext(std::function<void(const std::string&)> warn) : warn_(std::move(warn)) {
  if (!warn_) warn_ = [](const std::string& message) { std::cerr << "warning: " << message << "\n"; };
}

JsonReader::JsonReader(nlohmann::json& object, std::string path, ParseContext& context)
    : object_(object), path_(std::move(path)), context_(context) {}

std::string JsonReader::path_of(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

const nlohmann::json* JsonReader::lookup(const std::string& key) {
  if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
    known_.push_back(key);
    context_.note_known(path_of(key));
  }
  auto it = object_.find(key);
  if (it == object_.end()) return nullptr;
  if (it->is_string() && it->get<std::string>() == "auto") throw ConfigError(unfilled_auto_message(path_of(key)));
  return &*it;
}

bool JsonReader::has(const std::string& key) {
  const nlohmann::json* value = lookup(key);
  return value != nullptr && !value->is_null();
}

void JsonReader::fail(const std::string& key, const std::string& allowed) const {
  auto it = object_.find(key);
  std::string value = it == object_.end() ? "(absent)" : it->dump();
  throw ConfigError(path_of(key) + " = " + value + ": expected " + allowed);
}

void JsonReader::require(bool ok, const std::string& key, const std::string& allowed) const {
  if (!ok) fail(key, allowed);
}

std::optional<int64_t> JsonReader::get_optional_int(const std::string& key, int64_t min, int64_t max) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr || value->is_null()) {
    object_[key] = nullptr;
    return std::nullopt;
  }
  int64_t result = 0;
  if (value->is_number_integer()) {
    result = value->get<int64_t>();
    if (value->is_number_unsigned() && value->get<uint64_t>() > static_cast<uint64_t>(kNoMax)) {
      fail(key, int_range(min, max));
    }
  } else if (value->is_number_float()) {
    // JSON has one number type; 5e5 must mean 500000 where DeepSpeed expects an int, 5.5 must not.
    double d = value->get<double>();
    if (!std::isfinite(d) || std::floor(d) != d || std::fabs(d) >= 9.2e18) fail(key, int_range(min, max));
    result = static_cast<int64_t>(d);
  } else {
    fail(key, int_range(min, max));
  }
  if (result < min || result > max) fail(key, int_range(min, max));
  object_[key] = result;
  return result;
}

// A number key given as null: DeepSpeed reads it as None and fails later (e.g. `None > 0.0` in the step); here it is
// an error at load naming the key. Absent is what takes the default.
void JsonReader::refuse_null_number(const std::string& key, const std::string& what) {
  const nlohmann::json* value = lookup(key);
  if (value != nullptr && value->is_null()) {
    fail(key, what + " (null is not a value here; leave the key out for the default)");
  }
}

int64_t JsonReader::get_int(const std::string& key, int64_t def, int64_t min, int64_t max) {
  refuse_null_number(key, int_range(min, max));
  if (!has(key)) {
    object_[key] = def;
    return def;
  }
  return *get_optional_int(key, min, max);
}

double JsonReader::get_number(const std::string& key, double def) {
  refuse_null_number(key, "a number");
  if (!has(key)) {
    object_[key] = def;
    return def;
  }
  const nlohmann::json& value = *lookup(key);
  if (!value.is_number()) fail(key, "a number");
  return value.get<double>();
}

std::optional<bool> JsonReader::get_optional_bool(const std::string& key) {
  if (!has(key)) {
    object_[key] = nullptr;
    return std::nullopt;
  }
  const nlohmann::json& value = *lookup(key);
  if (!value.is_boolean()) fail(key, "true or false");
  return value.get<bool>();
}

bool JsonReader::get_bool(const std::string& key, bool def) {
  if (!has(key)) {
    object_[key] = def;
    return def;
  }
  return *get_optional_bool(key);
}

std::optional<std::string> JsonReader::get_optional_string(const std::string& key) {
  if (!has(key)) {
    object_[key] = nullptr;
    return std::nullopt;
  }
  const nlohmann::json& value = *lookup(key);
  if (!value.is_string()) fail(key, "a string");
  return value.get<std::string>();
}

std::vector<std::string> JsonReader::get_string_list(const std::string& key,
                                                     const std::vector<std::string>& allowed) {
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  if (!has(key)) {
    object_[key] = nlohmann::json::array();
    return {};
  }
  const nlohmann::json& value = *lookup(key);
  if (!value.is_array()) fail(key, "a list of names among " + list);
  std::vector<std::string> out;
  for (const auto& item : value) {
    const bool known = item.is_string() &&
                       std::find(allowed.begin(), allowed.end(), item.get<std::string>()) != allowed.end();
    if (!known) fail(key, "a list of names among " + list);
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::string JsonReader::get_string(const std::string& key, const std::string& def) {
  if (!has(key)) {
    object_[key] = def;
    return def;
  }
  return *get_optional_string(key);
}

std::string JsonReader::get_choice(const std::string& key, const std::string& def,
                                   const std::vector<std::string>& allowed) {
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : "|") + a;
  if (!has(key)) {
    object_[key] = def;
    return def;
  }
  const nlohmann::json& value = *lookup(key);
  if (!value.is_string()) fail(key, "one of " + list);
  std::string given = lower(value.get<std::string>());
  for (const auto& a : allowed) {
    if (lower(a) == given) {
      object_[key] = a;
      return a;
    }
  }
  fail(key, "one of " + list);
}

std::array<double, 2> JsonReader::get_pair(const std::string& key, std::array<double, 2> def) {
  if (!has(key)) {
    object_[key] = def;
    return def;
  }
  const nlohmann::json& value = *lookup(key);
  if (!value.is_array() || value.size() != 2 || !value[0].is_number() || !value[1].is_number()) {
    fail(key, "an array of two numbers, e.g. [0.9, 0.999]");
  }
  return {value[0].get<double>(), value[1].get<double>()};
}

void JsonReader::rename(const std::string& old_key, const std::string& key) {
  accept({old_key});
  auto it = object_.find(old_key);
  if (it == object_.end()) return;
  if (object_.contains(key)) {
    throw ConfigError(path_of(old_key) + " = " + it->dump() + ": an older name of " + path_of(key) +
                      ", which is also given; keep one of them");
  }
  object_[key] = *it;
  object_.erase(old_key);
}

std::vector<std::string> JsonReader::keys() const {
  std::vector<std::string> out;
  for (auto it = object_.begin(); it != object_.end(); ++it) out.push_back(it.key());
  return out;
}

JsonReader JsonReader::section(const std::string& key) {
  const nlohmann::json* value = lookup(key);
  if (value == nullptr || value->is_null()) object_[key] = nlohmann::json::object();
  if (!object_[key].is_object()) fail(key, "an object {...}");
  return JsonReader(object_[key], path_of(key), context_);
}

void JsonReader::accept(const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    if (object_.contains(key)) lookup(key);
    if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
      known_.push_back(key);
      context_.note_known(path_of(key));
    }
  }
}

namespace {

// DeepSpeed switches a feature on with `true`, with "enabled": true, or — for sections made of sub-sections
// (compression_training's techniques) — with any sub-section's "enabled" (or "shared_parameters.enabled").
bool switched_on(const nlohmann::json& value) {
  if (value.is_boolean()) return value.get<bool>();
  if (!value.is_object()) return false;
  if (value.contains("enabled")) return value["enabled"] == true;
  for (const auto& item : value) {
    if (switched_on(item)) return true;
  }
  return false;
}

}  // namespace

void JsonReader::accept_only_default(const std::string& key, const nlohmann::json& def) {
  accept({key});
  const nlohmann::json* value = lookup(key);
  if (value == nullptr || value->is_null() || *value == def) return;
  throw ConfigError(path_of(key) + " = " + value->dump() + ": not supported yet by deepspeed.cpp, which does what "
                    "DeepSpeed's default " + def.dump() + " does; remove the key or set it to " + def.dump());
}

void JsonReader::accept_if_disabled(const std::vector<std::string>& keys) {
  accept(keys);
  for (const auto& key : keys) {
    const nlohmann::json* value = lookup(key);
    if (value == nullptr) continue;
    if (switched_on(*value)) {
      throw ConfigError(path_of(key) + ": this DeepSpeed feature is not supported yet by deepspeed.cpp; remove the key "
                                       "or disable it");
    }
  }
}

void JsonReader::finish() {
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (std::find(known_.begin(), known_.end(), it.key()) != known_.end()) continue;
    const auto hint = suggest_key(it.key(), path_, known_, context_.known_paths());
    const std::string did_you_mean = hint ? "; did you mean '" + *hint + "'?" : "";
    if (!path_.empty()) {
      throw ConfigError("unknown config key '" + path_of(it.key()) + "' in section '" + path_ + "'" + did_you_mean +
                        " (deepspeed.cpp refuses unknown keys inside a section, where a misspelt key would otherwise change nothing "
                        "unnoticed)");
    }
    context_.warn("unknown config key '" + path_of(it.key()) + "' (ignored)" + did_you_mean);
  }
}

}  // namespace dscpp
