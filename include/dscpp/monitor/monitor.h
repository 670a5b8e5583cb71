// Monitor: where the engine's per-step events go: named scalars at a step, as DeepSpeed's monitors take
// them ("Train/Samples/train_loss" at the global sample count). Rank 0 writes them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/config/config.h"

namespace dscpp {

struct MonitorEvent {
  std::string name;  // "Train/Samples/train_loss"
  double value = 0;
  int64_t step = 0;  // DeepSpeed's x axis: samples seen so far
};

class Monitor {
 public:
  virtual ~Monitor() = default;
  virtual void write_events(const std::vector<MonitorEvent>& events) = 0;
};

// csv_monitor: one CSV per event name in `output_path/job_name/`, named after the event with '/' and ' ' replaced by
// '_' ("Train_Samples_train_loss.csv"), with the header "step,<last part of the name>" and one "step,value" row per
// event, appended and flushed as written (DeepSpeed's layout). Throws std::runtime_error naming the directory when
// it cannot be created.
std::unique_ptr<Monitor> make_csv_monitor(const MonitorConfig& config);

// tensorboard: a TensorBoard event file `output_path/job_name/events.out.tfevents.<unix time>.<host>`: a version
// record, then one Event (wall time, step, one scalar under the event's name as tag) per event, each in TFRecord
// framing with masked CRC-32C checksums, flushed after every write_events. Throws std::runtime_error naming the
// directory when it cannot be created.
std::unique_ptr<Monitor> make_tensorboard_monitor(const MonitorConfig& config);

}  // namespace dscpp
