// StepObserver: the timers, profilers, memory counters and monitors around a training step.
#include "dscpp/engine/step_observer.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <tuple>

#include "dscpp/monitor/memory_tracker.h"
#include "dscpp/monitor/step_log.h"

namespace dscpp {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

StepObserver::StepObserver(const Config& config, int rank, torch::Device device, torch::ScalarType dtype,
                           std::function<void(const std::string&)> log)
    : config_(config), rank_(rank), device_(device), dtype_(dtype), log_(std::move(log)), last_print_ns_(now_ns()) {}

void StepObserver::track_memory() {
  if (config_.memory_breakdown) {
    if (device_.is_cpu()) {
      CpuMemoryTracker::install();
    } else {
      device_memory_.emplace(device_);
    }
  }
}

StepObserver::~StepObserver() {
  if (!comms_logger_) return;
  try {
    log_(comms_logger_->summary());
  } catch (...) {  // a destructor must not throw; the summary is a courtesy
  }
}

std::shared_ptr<Comm> StepObserver::observe(std::shared_ptr<Comm> comm) {
  if (!config_.comms_logger.enabled) return comm;
  // debug: every rank prints its own operations, so its sink is this rank's stderr rather than rank 0's log.
  std::function<void(const std::string&)> sink = log_;
  if (config_.comms_logger.debug) sink = [](const std::string& line) { std::cerr << line << std::endl; };
  comms_logger_ = std::make_shared<CommsLogger>(config_.comms_logger, comm->rank(), comm->world_size(), sink);
  return make_logged_comm(std::move(comm), comms_logger_);
}

void StepObserver::open_monitors(Comm& comm) {
  using MonitorFactory = std::unique_ptr<Monitor> (*)(const MonitorConfig&);
  const std::vector<std::tuple<const char*, const MonitorConfig*, MonitorFactory>> monitors = {
      {"csv_monitor", &config_.csv_monitor, &make_csv_monitor},
      {"tensorboard", &config_.tensorboard, &make_tensorboard_monitor}};
  for (const auto& [key, monitor_config, make] : monitors) {
    if (!monitor_config->enabled) continue;
    std::string error;
    if (comm.rank() == 0) {
      try {
        monitors_.push_back(make(*monitor_config));
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (comm.side_all_gather({error.empty() ? 0 : 1})[0] != 0) {
      throw std::runtime_error(error.empty() ? std::string(key) + ": rank 0 could not create its directory (see its log)"
                                             : error);
    }
  }
}

StepObserver::PhaseTimer::PhaseTimer(StepObserver& observer, Phase first, std::optional<Phase> second)
    : observer_(observer), first_(first), second_(second), start_ns_(now_ns()) {}

StepObserver::PhaseTimer::~PhaseTimer() {
  try {
    const int64_t end = observer_.now_synchronized();
    observer_.add(first_, start_ns_, end);
    if (second_) observer_.add(*second_, start_ns_, end);
  } catch (...) {  // a failed device sync is reported by the work that failed, not by its timer
  }
}

int64_t StepObserver::now_synchronized() const {
  if (config_.wall_clock_breakdown && device_.is_cuda()) torch::cuda::synchronize(device_.index());
  return now_ns();
}

void StepObserver::add(Phase phase, int64_t start_ns, int64_t end_ns) { step_times_[phase] += (end_ns - start_ns) * 1e-9; }

void StepObserver::forward_begins(int64_t step) {
  forward_start_ns_ = now_ns();
  if (device_memory_) {
    forward_start_bytes_ = device_memory_->allocated();
    device_memory_->reset_peak();
  } else if (CpuMemoryTracker::installed()) {
    forward_start_bytes_ = CpuMemoryTracker::allocated();
    CpuMemoryTracker::reset_peak();
  }
  const auto& flops = config_.flops_profiler;
  if (flops.enabled && step == flops.profile_step) flops_counter_ = std::make_unique<FlopsCounter>();
}

void StepObserver::forward_ends() {
  if (flops_counter_) {
    flops_profile_.forward_flops += flops_counter_->total();
    for (const auto& [name, n] : flops_counter_->by_module()) flops_profile_.by_module[name] += n;
    for (const auto& [op, n] : flops_counter_->by_op()) flops_profile_.by_op[op] += n;
    ++flops_profile_.micro_steps;
    flops_counter_.reset();
  }
  add(Phase::kForward, forward_start_ns_, now_synchronized());
}

void StepObserver::backward_ends() {
  ++step_times_.micro_steps;
  if (device_memory_) {
    activations_peak_ = std::max(activations_peak_, device_memory_->peak() - forward_start_bytes_);
  } else if (CpuMemoryTracker::installed() && device_.is_cpu()) {
    activations_peak_ = std::max(activations_peak_, CpuMemoryTracker::peak() - forward_start_bytes_);
  }
}

std::optional<int64_t> StepObserver::live_tensor_bytes() const {
  if (device_memory_) return device_memory_->allocated();
  if (CpuMemoryTracker::installed()) return CpuMemoryTracker::allocated();
  return std::nullopt;
}

void StepObserver::step_ends(StepReport& report, const TrainingProgress& progress,
                             const std::function<std::vector<std::string>()>& details) {
  step_times_.steps = 1;
  report.times = step_times_;
  print_window_.add(step_times_);
  step_times_ = PhaseTimes{};
  if (config_.flops_profiler.enabled && report.step == config_.flops_profiler.profile_step) profile_flops(report);
  print(report, progress, details);
  write_monitors(report, progress);
}

void StepObserver::profile_flops(const StepReport& report) {
  const auto& config = config_.flops_profiler;
  flops_profile_.step = report.step;
  flops_profile_.recompute_fwd_factor = config.recompute_fwd_factor;
  flops_profile_.step_s = report.times[Phase::kForward] + report.times[Phase::kBackward] + report.times[Phase::kStep];
  flops_profile_.peak_flops = measure_peak_flops(dtype_, device_);
  const auto text = "[deepspeed.cpp] " + describe(flops_profile_, config.top_modules, config.module_depth, config.detailed);
  if (config.output_file.empty()) {
    log_(text);
  } else if (rank_ == 0) {
    std::ofstream out(config.output_file, std::ios::app);
    out << text << '\n';
    if (!out) log_("[deepspeed.cpp] flops_profiler.output_file " + config.output_file + ": cannot write; " + text);
  }
}

void StepObserver::print(const StepReport& report, const TrainingProgress& progress,
                         const std::function<std::vector<std::string>()>& details) {
  if (report.step % config_.steps_per_print != 0) return;
  const int64_t now = now_ns();
  const double seconds = (now - last_print_ns_) * 1e-9;
  last_print_ns_ = now;
  const double samples_per_s = seconds > 0 ? config_.batch.train_batch_size * config_.steps_per_print / seconds : 0.0;
  log_(format_step_line(report.step, report.loss, report.lr, report.loss_scale, report.grad_norm, samples_per_s,
                        progress.skipped_steps));
  if (config_.wall_clock_breakdown) log_("[deepspeed.cpp] " + format_wall_clock(print_window_));
  print_window_ = PhaseTimes{};
  for (const auto& line : details()) log_("[deepspeed.cpp] " + line);
}

void StepObserver::write_monitors(const StepReport& report, const TrainingProgress& progress) {
  if (monitors_.empty()) return;
  const int64_t x = progress.global_samples;
  std::vector<MonitorEvent> events = {{"Train/Samples/train_loss", report.loss, x},
                                      {"Train/Samples/lr", report.lr, x}};
  if (config_.fp16.enabled) events.push_back({"Train/Samples/loss_scale", report.loss_scale, x});
  if (config_.wall_clock_breakdown) {
    const char* names[kPhases] = {"forward", "backward", "backward_inner", "backward_allreduce", "step"};
    for (size_t i = 0; i < kPhases; ++i) {
      events.push_back({std::string("Train/Samples/elapsed_time_ms_") + names[i], report.times.seconds[i] * 1e3, x});
    }
  }
  for (auto& monitor : monitors_) monitor->write_events(events);
}

}  // namespace dscpp
