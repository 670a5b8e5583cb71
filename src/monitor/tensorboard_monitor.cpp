// The TensorBoard monitor: an event file TensorBoard reads — TFRecord framing (length, masked CRC-32C of the length,
// the serialized Event, masked CRC-32C of it) around Event messages encoded with libprotobuf from our own .proto.
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "crc32c.h"
#include "dscpp/monitor/monitor.h"
#include "tensorboard_event.pb.h"

namespace dscpp {
namespace {

namespace fs = std::filesystem;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class TensorBoardMonitor final : public Monitor {
 public:
  explicit TensorBoardMonitor(const MonitorConfig& config) {
    const fs::path dir = fs::path(config.output_path) / config.job_name;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec || !fs::is_directory(dir)) {
      throw std::runtime_error("tensorboard: cannot create " + dir.string() + " (output_path/job_name): " +
                               (ec ? ec.message() : std::string("not a directory")));
    }
    char host[256] = "localhost";
    ::gethostname(host, sizeof host - 1);
    // TensorBoard picks up files whose name contains "tfevents"; this is the name TensorFlow's writers use.
    path_ = dir / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now_seconds())) + "." + host);
    out_.open(path_, std::ios::binary | std::ios::app);
    if (!out_) throw std::runtime_error("tensorboard: cannot write " + path_.string());
    tensorboard::Event first;
    first.set_wall_time(now_seconds());
    first.set_file_version("brain.Event:2");
    write_record(first.SerializeAsString());
    flush();
  }

  void write_events(const std::vector<MonitorEvent>& events) override {
    const double wall_time = now_seconds();
    for (const auto& e : events) {
      tensorboard::Event event;
      event.set_wall_time(wall_time);
      event.set_step(e.step);
      auto* value = event.mutable_summary()->add_value();
      value->set_tag(e.name);
      value->set_simple_value(static_cast<float>(e.value));
      write_record(event.SerializeAsString());
    }
    flush();  // a crash loses at most the step being written
  }

 private:
  void write_record(const std::string& data) {
    char header[12];
    const uint64_t length = data.size();
    std::memcpy(header, &length, 8);  // little-endian, as on every machine this builds for
    const uint32_t length_crc = masked_crc32c(header, 8);
    std::memcpy(header + 8, &length_crc, 4);
    const uint32_t data_crc = masked_crc32c(data.data(), data.size());
    out_.write(header, sizeof header);
    out_.write(data.data(), static_cast<std::streamsize>(data.size()));
    out_.write(reinterpret_cast<const char*>(&data_crc), 4);
  }

  void flush() {
    out_.flush();
    if (!out_) throw std::runtime_error("tensorboard: writing " + path_.string() + " failed");
  }

  fs::path path_;
  std::ofstream out_;
};

}  // namespace

std::unique_ptr<Monitor> make_tensorboard_monitor(const MonitorConfig& config) {
  return std::make_unique<TensorBoardMonitor>(config);
}

}  // namespace dscpp
