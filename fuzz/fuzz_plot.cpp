// `dscpp plot`'s input: a metrics .jsonl, one JSON object per line, rendered to SVG.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <sstream>
#include <string>

#include "plot_command.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream jsonl(std::string(reinterpret_cast<const char*>(data), size));
  dscpp::PlotSummary summary;
  try {
    const std::string svg = dscpp::render_plot(jsonl, "metrics.jsonl", "fuzz", summary);
    if (svg.find("<svg") == std::string::npos) __builtin_trap();
  } catch (const std::exception& e) {
    if (std::string(e.what()).empty()) __builtin_trap();
  }
  return 0;
}
