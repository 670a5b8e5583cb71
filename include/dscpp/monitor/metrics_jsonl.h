// MetricsJsonl: one JSON object per optimizer step appended to a file (gpt-train's --metrics), flushed per line so
// a crashed run keeps every step it finished.
#pragma once

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

namespace dscpp {

class MetricsJsonl {
 public:
  // Opens `path` for writing (truncating unless `append`); throws std::runtime_error naming the path on failure.
  explicit MetricsJsonl(const std::string& path, bool append = false);
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace dscpp
