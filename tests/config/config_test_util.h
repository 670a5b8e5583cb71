// Helpers for the config tests: parse with captured warnings, catch the ConfigError message, substring checks.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dscpp/config/config.h"

namespace dscpp::testing {

inline Config parse(const nlohmann::json& json, ConfigOptions options = {},
                    std::vector<std::string>* warnings = nullptr) {
  options.warn = [warnings](const std::string& m) {
    if (warnings != nullptr) warnings->push_back(m);
  };
  return Config::from_json(json, options);
}

// The ConfigError message, or "<no error>".
inline std::string error_of(const nlohmann::json& json, ConfigOptions options = {}) {
  options.warn = [](const std::string&) {};
  try {
    Config::from_json(json, options);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

// The HF-style values a user would pass (micro 4, grad_accum 2, lr 3e-4, weight_decay 0.01, warmup 10, total 100,
// hidden 768, clip 1.0; fp16 on), shared by the auto-filling and shared-config tests.
inline AutoValues::HfArgs user_args() {
  AutoValues::HfArgs a;
  a.micro_batch = 4;
  a.grad_accum = 2;
  a.lr = 3e-4;
  a.weight_decay = 0.01;
  a.warmup_steps = 10;
  a.total_steps = 100;
  a.fp16 = true;
  a.hidden_size = 768;
  a.max_grad_norm = 1.0;
  return a;
}

#define EXPECT_CONTAINS(haystack, needle)                                                   \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)                          \
      << "expected to find [" << (needle) << "] in [" << (haystack) << "]"

}  // namespace dscpp::testing
