// The DeepSpeed config: JSON text through Config::from_string (parse, "auto" filling, every section's validation),
// on 1 and 3 ranks (the batch triangle). A config is outside input: anything may come, and the only way out is a
// clear error (std::exception with a message) or a config.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "dscpp/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (int world : {1, 3}) {
    dscpp::ConfigOptions options;
    options.world_size = world;
    options.warn = [](const std::string&) {};
    try {
      const auto config = dscpp::Config::from_string(text, options);
      (void)config.resolved.dump();  // the resolved JSON must be whole enough to print
    } catch (const std::exception& e) {
      if (std::string(e.what()).empty()) __builtin_trap();  // an error must say something
    }
  }
  return 0;
}
