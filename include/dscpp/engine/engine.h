// Engine: one training step, in order — backward (scale, accumulate) → step (reduce, check overflow, clip,
// optimizer on the master partition, publish params, advance the schedule). The stage, scaler, optimizer and
// schedule are chosen once from the config; the engine only sequences them.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dscpp/comm/comm.h"
#include "dscpp/config/config.h"
#include "dscpp/engine/memory_report.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/precision/loss_scaler.h"
#include "dscpp/schedule/lr_schedule.h"
#include "dscpp/zero/flat_params.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

struct InitOptions {
  std::shared_ptr<Comm> comm;                        // default: init_comm(DistEnv::from_env())
  std::optional<OptimizerConfig> client_optimizer;   // used when the config has no "optimizer" section
  std::function<void(const std::string&)> log;       // rank 0's log sink; default: stderr on rank 0
};

// What the last accumulation boundary did.
struct StepReport {
  int64_t step = 0;           // optimizer boundaries so far (skipped ones included, as DeepSpeed's global_steps)
  double loss = 0.0;          // mean loss over the global batch (all ranks, all micro-steps)
  double lr = 0.0;            // the lr this step used
  double loss_scale = 1.0;    // the scale this step's backward used
  double grad_norm = 0.0;     // global L2 norm of the unscaled gradients, before clipping
  bool skipped = false;       // overflow: parameters, optimizer state and schedule untouched
};

class Engine {
 public:
  Engine(std::shared_ptr<torch::nn::Module> model, Config config, InitOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs the model's forward: `loss_fn` computes the micro-batch's mean loss.
  torch::Tensor forward(const std::function<torch::Tensor()>& loss_fn) { return loss_fn(); }

  // Scales the loss (loss scale / gradient_accumulation_steps) and runs backward into the flat gradient buffer.
  void backward(const torch::Tensor& loss);

  // Ends the micro-step. On an accumulation boundary it updates the parameters and returns true (false when the
  // step was skipped for overflow); off the boundary it does nothing and returns false.
  bool step();

  bool is_gradient_accumulation_boundary() const;

  const Config& config() const { return config_; }
  Comm& comm() { return *comm_; }
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->world_size(); }
  torch::ScalarType compute_dtype() const { return flat_->dtype(); }

  int64_t global_steps() const { return global_steps_; }
  int64_t micro_steps() const { return micro_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  double lr() const;                                 // the lr the next optimizer step will use
  double loss_scale() const { return scaler_->scale(); }
  const StepReport& last_step() const { return last_step_; }
  ModelStateMemory memory() const;

 private:
  void update(StepReport& report);
  void log_step(const StepReport& report);

  Config config_;
  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<Comm> comm_;
  std::function<void(const std::string&)> log_;
  std::unique_ptr<FlatParams> flat_;
  std::unique_ptr<ZeroStage> stage_;
  std::unique_ptr<FlatOptimizer> optimizer_;
  std::unique_ptr<LRSchedule> schedule_;
  std::unique_ptr<LossScaler> scaler_;

  int64_t micro_steps_ = 0;
  int64_t global_steps_ = 0;
  int64_t skipped_steps_ = 0;
  int64_t optimizer_state_bytes_ = 0;
  torch::Tensor loss_sum_;    // () fp32: sum of this rank's micro-step losses since the last boundary
  StepReport last_step_;
  int64_t last_log_time_ns_ = 0;
};

// Builds the engine: casts the model to the compute dtype, flattens its parameters, builds stage, optimizer,
// schedule and scaler from `config`. Throws ConfigError for config values the engine does not support yet.
std::unique_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model, const Config& config,
                                   InitOptions options = {});

}  // namespace dscpp
