// MetricsJsonl: append-only JSON lines.
#include "dscpp/monitor/metrics_jsonl.h"

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace dscpp {

MetricsJsonl::MetricsJsonl(const std::string& path, bool append)
    : path_(path), out_(path, append ? std::ios::app : std::ios::trunc) {
  if (!out_) throw std::runtime_error("cannot open metrics file '" + path + "': " + std::strerror(errno));
}

void MetricsJsonl::write(const nlohmann::json& record) {
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("cannot write metrics file '" + path_ + "'");
}

}  // namespace dscpp
