// Filling "auto" before parsing: the program's values (HF-style flags, hidden size) replace "auto" by dotted path.
// Internal to the config layer; AutoValues itself is declared in config.h.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>

#include "dscpp/config/config.h"

namespace dscpp {

// The three batch keys of the triangle, in the order train, micro, grad_accum.
extern const char* const kBatchKeys[3];

// Replaces every "auto" whose dotted path has a value in `auto_values`. Batch keys absent from the config are
// filled too, but only when the config states no batch key as a number (it leaves the batch to the program):
// explicit numbers in the file always win, and an auto-filled side never contradicts them. Last, the program's
// default micro-batch fills where neither train_batch_size nor the micro-batch is a number.
void fill_auto(nlohmann::json& config, const AutoValues& auto_values);

// Sets `value` at a dotted path ("zero_optimization.stage"), creating objects on the way.
void set_dotted(nlohmann::json& config, const std::string& path, const nlohmann::json& value);

// The ConfigError message for an "auto" nothing filled, saying which flag fills it.
std::string unfilled_auto_message(const std::string& path);

// Throws ConfigError for the first "auto" string left anywhere in `config` (unknown keys included).
void check_no_auto_left(const nlohmann::json& config, const std::string& path = "");

}  // namespace dscpp
