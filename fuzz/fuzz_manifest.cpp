// A checkpoint's manifest.json: Manifest::from_json checks every file, fragment, slice and tiling before a load
// trusts any size or offset in it.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>

#include "dscpp/checkpoint/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto json = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return 0;
  try {
    const auto manifest = dscpp::Manifest::from_json(json, "manifest.json");
    // What a valid manifest writes must read back.
    (void)dscpp::Manifest::from_json(manifest.to_json(), "manifest.json (written back)");
  } catch (const std::exception& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
  }
  return 0;
}
