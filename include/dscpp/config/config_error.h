// ConfigError: every invalid config (value, type, range, contradiction, unfilled "auto") is one of these.
// The message names the key as a dotted path, the value found and what is allowed.
#pragma once

#include <stdexcept>

namespace dscpp {

class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace dscpp
