// TensorBoard event files, read back without our writer's code: TFRecord framing with both masked CRC-32Cs checked
// (by a bitwise CRC of the test's own), then the Event messages decoded from the protobuf wire format by hand.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "../common/subprocess.h"
#include "../engine/test_models.h"
#include "dscpp/engine/engine.h"
#include "dscpp/monitor/monitor.h"

namespace dscpp::testing {
namespace {

namespace fs = std::filesystem;

uint32_t bitwise_crc32c(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t masked(const std::string& bytes) {
  const uint32_t crc = bitwise_crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::string tag;
  float value = 0;
};

// Minimal protobuf wire decoding: varints, 64-bit, 32-bit and length-delimited fields.
struct Wire {
  const std::string& s;
  size_t pos = 0;
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<unsigned char>(s.at(pos++));
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  }
  std::string bytes() {
    const auto n = varint();
    auto out = s.substr(pos, n);
    pos += n;
    return out;
  }
  template <typename T>
  T fixed() {
    T v;
    std::memcpy(&v, s.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  bool done() const { return pos >= s.size(); }
};

Event decode(const std::string& data) {
  Event e;
  Wire w{data};
  while (!w.done()) {
    const auto key = w.varint();
    const int field = static_cast<int>(key >> 3), type = static_cast<int>(key & 7);
    if (field == 1 && type == 1) {
      e.wall_time = w.fixed<double>();
    } else if (field == 2 && type == 0) {
      e.step = static_cast<int64_t>(w.varint());
    } else if (field == 3 && type == 2) {
      e.file_version = w.bytes();
    } else if (field == 5 && type == 2) {  // Summary { repeated Value value = 1 }
      const auto summary = w.bytes();
      Wire sw{summary};
      EXPECT_EQ(sw.varint(), (1u << 3) | 2u);
      const auto value = sw.bytes();
      Wire vw{value};
      while (!vw.done()) {
        const auto vkey = vw.varint();
        if (vkey == ((1u << 3) | 2u)) e.tag = vw.bytes();
        else if (vkey == ((2u << 3) | 5u)) e.value = vw.fixed<float>();
        else ADD_FAILURE() << "unexpected Value field " << vkey;
      }
    } else {
      ADD_FAILURE() << "unexpected Event field " << field << " of type " << type;
      break;
    }
  }
  return e;
}

// Every record of the file, its framing and both CRCs checked; `corrupt` is the number of records that failed.
std::vector<Event> read_events(const fs::path& path, int* corrupt = nullptr) {
  std::ifstream in(path, std::ios::binary);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<Event> events;
  size_t pos = 0;
  int bad = 0;
  while (pos + 12 <= file.size()) {
    const std::string length_bytes = file.substr(pos, 8);
    uint64_t length;
    uint32_t length_crc, data_crc;
    std::memcpy(&length, length_bytes.data(), 8);
    std::memcpy(&length_crc, file.data() + pos + 8, 4);
    if (length_crc != masked(length_bytes) || pos + 12 + length + 4 > file.size()) {
      ++bad;
      break;
    }
    const std::string data = file.substr(pos + 12, length);
    std::memcpy(&data_crc, file.data() + pos + 12 + length, 4);
    if (data_crc != masked(data)) ++bad;
    else events.push_back(decode(data));
    pos += 12 + length + 4;
  }
  EXPECT_EQ(pos, file.size()) << "trailing bytes";
  if (corrupt) *corrupt = bad;
  return events;
}

fs::path only_event_file(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path());
  EXPECT_EQ(files.size(), 1u) << dir;
  return files.empty() ? fs::path() : files[0];
}

TEST(TensorBoardMonitor, CrcIsCastagnoli) {
  EXPECT_EQ(bitwise_crc32c("123456789"), 0xE3069283u);  // the check value of CRC-32C
}

TEST(TensorBoardMonitor, EventsReadBackWithTagsStepsValuesAndChecksums) {
  const auto root = temp_dir("tensorboard");
  MonitorConfig config;
  config.output_path = root.string();
  config.job_name = "job1";
  const double before = static_cast<double>(::time(nullptr)) - 1;
  {
    auto monitor = make_tensorboard_monitor(config);
    monitor->write_events({{"Train/Samples/train_loss", 5.25, 16}, {"Train/Samples/lr", 1e-3, 16}});
    monitor->write_events({{"Train/Samples/train_loss", 4.5, 32}});
  }
  const auto path = only_event_file(root / "job1");
  EXPECT_EQ(path.filename().string().rfind("events.out.tfevents.", 0), 0u) << path;
  int corrupt = 0;
  const auto events = read_events(path, &corrupt);
  EXPECT_EQ(corrupt, 0);
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GE(events[0].wall_time, before);
  const std::vector<std::tuple<std::string, int64_t, float>> want = {
      {"Train/Samples/train_loss", 16, 5.25f}, {"Train/Samples/lr", 16, 1e-3f}, {"Train/Samples/train_loss", 32, 4.5f}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(events[i + 1].tag, std::get<0>(want[i]));
    EXPECT_EQ(events[i + 1].step, std::get<1>(want[i]));
    EXPECT_EQ(events[i + 1].value, std::get<2>(want[i]));
    EXPECT_GE(events[i + 1].wall_time, events[0].wall_time);
  }

  // The reader's checks can fail: one flipped byte in the last record's data is caught.
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-8, std::ios::end);
  f.put('\x7f');
  f.close();
  read_events(path, &corrupt);
  EXPECT_EQ(corrupt, 1);
}

TEST(TensorBoardMonitor, UncreatableDirectoryIsAnErrorNamingIt) {
  const auto root = temp_dir("tensorboard_bad");
  std::ofstream(root / "file") << "x";
  MonitorConfig config;
  config.output_path = (root / "file").string();
  try {
    make_tensorboard_monitor(config);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find((root / "file").string()), std::string::npos) << e.what();
  }
}

TEST(TensorBoardMonitor, TheEngineWritesTheLossAtTheSampleCount) {
  const auto root = temp_dir("tensorboard_engine");
  auto model = Mlp();
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 4,
      "tensorboard": {"enabled": true, "output_path": ")" + root.string() + R"(", "job_name": "run"},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"));
  auto [x, y] = regression_data(4);
  std::vector<float> losses;
  for (int step = 0; step < 3; ++step) {
    engine->backward(engine->forward([&] { return model->loss(x, y); }));
    engine->step();
    losses.push_back(static_cast<float>(engine->last_step().loss));
  }
  std::vector<Event> loss_events;
  for (const auto& e : read_events(only_event_file(root / "run"))) {
    if (e.tag == "Train/Samples/train_loss") loss_events.push_back(e);
  }
  ASSERT_EQ(loss_events.size(), 3u);
  for (int step = 0; step < 3; ++step) {
    EXPECT_EQ(loss_events[step].step, 4 * (step + 1));
    EXPECT_EQ(loss_events[step].value, losses[step]);
  }
}

}  // namespace
}  // namespace dscpp::testing
