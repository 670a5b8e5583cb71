// StepObserver: everything that watches a training step without changing it — the phase timers
// (wall_clock_breakdown), the FLOPs profiler, the activation-memory peak (memory_breakdown), the comms logger, the
// steps_per_print line and the monitors. The engine tells it where the step stands (forward began, backward ended,
// a boundary's report); timers are scoped (PhaseTimer), so a phase that throws is still closed. Nothing here is
// collective except open_monitors and what step_ends' `details` does.
#pragma once

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/comm/comm.h"
#include "dscpp/comm/comms_logger.h"
#include "dscpp/config/config.h"
#include "dscpp/engine/progress.h"
#include "dscpp/monitor/device_memory.h"
#include "dscpp/monitor/flops_profiler.h"
#include "dscpp/monitor/monitor.h"
#include "dscpp/monitor/wall_clock.h"

namespace dscpp {

// What the last accumulation boundary did.
struct StepReport {
  int64_t step = 0;           // optimizer boundaries so far (skipped ones included, as DeepSpeed's global_steps)
  double loss = 0.0;          // mean loss over the global batch (all ranks, all micro-steps)
  double lr = 0.0;            // the lr the next step will use (DeepSpeed's get_lr() after this step)
  double loss_scale = 1.0;    // the scale this step's backward used
  double grad_norm = 0.0;     // global L2 norm of the unscaled gradients, before clipping
  bool skipped = false;       // overflow: parameters, optimizer state and schedule untouched
  PhaseTimes times;           // this optimizer step's micro-steps: fwd, bwd (inner, allreduce), step
};

class StepObserver {
 public:
  // `rank`: this rank in the data-parallel group (rank 0 writes the files); `device`: where training runs (with
  // wall_clock_breakdown a GPU is synchronized before each reading, so asynchronous work counts where it ran);
  // `dtype`: the compute dtype (the FLOPs profiler's peak); `log`: rank 0's sink.
  StepObserver(const Config& config, int rank, torch::Device device, torch::ScalarType dtype,
               std::function<void(const std::string&)> log);
  ~StepObserver();  // logs the comms logger's summary
  StepObserver(const StepObserver&) = delete;
  StepObserver& operator=(const StepObserver&) = delete;

  // comms_logger: `comm` wrapped in the logging decorator (every collective counted); `comm` itself otherwise.
  std::shared_ptr<Comm> observe(std::shared_ptr<Comm> comm);
  // csv_monitor, tensorboard: rank 0 opens them; every rank learns whether it could, so none is left waiting in a
  // collective. Collective over `comm`; std::runtime_error on every rank when rank 0 failed.
  void open_monitors(Comm& comm);

  // memory_breakdown: from here on the device's allocator is read (on the CPU, CpuMemoryTracker installed, which
  // counts only what is allocated after it), so call it once the model states are in place.
  void track_memory();

  void log(const std::string& line) const { log_(line); }
  const std::function<void(const std::string&)>& log_sink() const { return log_; }

  // Adds the seconds it lives to its phases of the optimizer step in progress.
  class PhaseTimer {
   public:
    PhaseTimer(StepObserver& observer, Phase first, std::optional<Phase> second = std::nullopt);
    ~PhaseTimer();
    PhaseTimer(const PhaseTimer&) = delete;
    PhaseTimer& operator=(const PhaseTimer&) = delete;

   private:
    StepObserver& observer_;
    Phase first_;
    std::optional<Phase> second_;
    int64_t start_ns_;
  };

  // A micro-step's forward, which a front end may run between two calls (Python's engine(batch)): the memory mark
  // activations are measured from, and on the profiled step (`step`: the optimizer step it belongs to) the FLOPs
  // counter. forward_ends closes both and the forward's time.
  void forward_begins(int64_t step);
  void forward_ends();
  // Runs `fn`, gather unit `unit`'s forward, with its FLOPs attributed to its name (`names[unit]`; "(unit)" for
  // an index out of range) while the profiler counts. A template: every block's forward passes through it, and
  // outside the profiled step it costs one test.
  template <typename Forward>
  torch::Tensor in_unit(const std::vector<std::string>& names, int unit, Forward&& fn) {
    if (!flops_counter_) return fn();
    const bool named = unit >= 0 && unit < static_cast<int>(names.size());
    FlopsCounter::Scope scope(named ? names[unit] : std::string("(unit)"));
    return fn();
  }
  // A micro-step's backward ended: its activation peak and the micro-step count.
  void backward_ends();

  // An accumulation boundary: fills report.times, then the flops profile (on its step), the steps_per_print line
  // with `details`' lines (memory_breakdown, activation_checkpointing.profile; called on every rank at a print step
  // and may be collective) and the monitors' events.
  void step_ends(StepReport& report, const TrainingProgress& progress,
                 const std::function<std::vector<std::string>()>& details);

  const CommsLogger* comms_logger() const { return comms_logger_.get(); }
  const FlopsProfile& flops_profile() const { return flops_profile_; }
  // The largest activation growth of a micro-step so far (MemoryBreakdown::activations_peak; -1 before).
  int64_t activations_peak() const { return activations_peak_; }
  // Bytes held by tensors now, where memory_breakdown measures them (nullopt when it does not).
  std::optional<int64_t> live_tensor_bytes() const;

 private:
  void add(Phase phase, int64_t start_ns, int64_t end_ns);
  int64_t now_synchronized() const;  // now, after the device's queued work with wall_clock_breakdown
  void profile_flops(const StepReport& report);
  void print(const StepReport& report, const TrainingProgress& progress,
             const std::function<std::vector<std::string>()>& details);
  void write_monitors(const StepReport& report, const TrainingProgress& progress);

  const Config config_;  // a copy: the observer is built before the engine that keeps the config
  int rank_;
  torch::Device device_;
  torch::ScalarType dtype_;
  std::function<void(const std::string&)> log_;
  std::shared_ptr<CommsLogger> comms_logger_;
  std::vector<std::unique_ptr<Monitor>> monitors_;  // rank 0 only
  std::unique_ptr<FlopsCounter> flops_counter_;     // during the profiled step's forwards
  FlopsProfile flops_profile_;
  PhaseTimes step_times_;    // the optimizer step in progress
  PhaseTimes print_window_;  // since the last steps_per_print line
  int64_t last_print_ns_;
  int64_t forward_start_ns_ = 0;
  std::optional<DeviceMemoryCounter> device_memory_;  // memory_breakdown on a GPU (on the CPU, CpuMemoryTracker)
  int64_t forward_start_bytes_ = 0;  // tensor bytes held when the micro-step's forward began
  int64_t activations_peak_ = -1;
};

}  // namespace dscpp
