// The CSV monitor: DeepSpeed's csv_monitor layout, one file per event name.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "dscpp/monitor/monitor.h"

namespace dscpp {
namespace {

namespace fs = std::filesystem;

class CsvMonitor final : public Monitor {
 public:
  explicit CsvMonitor(const MonitorConfig& config) : dir_(fs::path(config.output_path) / config.job_name) {
    std::error_code ec;
    fs::create_directories(dir_, ec);
    if (ec || !fs::is_directory(dir_)) {
      throw std::runtime_error("csv_monitor: cannot create " + dir_.string() + " (output_path/job_name): " +
                               (ec ? ec.message() : std::string("not a directory")));
    }
  }

  void write_events(const std::vector<MonitorEvent>& events) override {
    for (const auto& e : events) {
      std::string file = e.name;
      for (char& c : file) {
        if (c == '/' || c == ' ') c = '_';
      }
      const auto path = dir_ / (file + ".csv");
      const bool fresh = !fs::exists(path);
      std::ofstream out(path, std::ios::app);
      if (!out) throw std::runtime_error("csv_monitor: cannot append to " + path.string());
      if (fresh) out << "step," << e.name.substr(e.name.rfind('/') + 1) << '\n';
      char value[64];
      std::snprintf(value, sizeof value, "%.17g", e.value);  // exact: the double reads back as written
      out << e.step << ',' << value << '\n';
    }
  }

 private:
  fs::path dir_;
};

}  // namespace

std::unique_ptr<Monitor> make_csv_monitor(const MonitorConfig& config) { return std::make_unique<CsvMonitor>(config); }

}  // namespace dscpp
