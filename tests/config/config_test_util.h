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

#define EXPECT_CONTAINS(haystack, needle)                                                   \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos)                          \
      << "expected to find [" << (needle) << "] in [" << (haystack) << "]"

}  // namespace dscpp::testing
