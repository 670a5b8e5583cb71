// Engine: one training step, in order — backward (scale, accumulate) → step (reduce, check overflow, clip,
// optimizer on the master partition, publish params, advance the schedule). The parts — stage, optimizer and where
// its step runs, schedule, scaler, parallel layout, observer — are built once from the config by assemble()
// (assemble.h); the engine only sequences them (and hands checkpoints to its Checkpointer). It trains a model's
// tensors (ModelTensors), which a LibTorch module or a Python nn.Module gives.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/activation/checkpointing.h"
#include "dscpp/checkpoint/manifest.h"
#include "dscpp/comm/comm.h"
#include "dscpp/comm/comms_logger.h"
#include "dscpp/config/config.h"
#include "dscpp/engine/assemble.h"
#include "dscpp/engine/checkpointer.h"
#include "dscpp/engine/init_options.h"
#include "dscpp/engine/memory_report.h"
#include "dscpp/engine/model_tensors.h"
#include "dscpp/engine/optimizer_step.h"
#include "dscpp/engine/parallel_layout.h"
#include "dscpp/engine/progress.h"
#include "dscpp/engine/step_observer.h"
#include "dscpp/monitor/flops_profiler.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/precision/loss_scaler.h"
#include "dscpp/schedule/lr_schedule.h"
#include "dscpp/zero/flat_params.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

class Engine {
 public:
  // A LibTorch module: its tensors (model_tensors), the units InitOptions names, and a model built partitioned.
  Engine(std::shared_ptr<torch::nn::Module> model, Config config, InitOptions options);
  // Any model given as its tensors (the Python front end's way in). InitOptions::gather_units and ::partitioned
  // must be empty: they name LibTorch modules.
  Engine(ModelTensors model, Config config, InitOptions options);
  // The parts assemble() built: what a composer that builds them itself gives (PipelineEngine, one engine per
  // stage, with its own groups).
  explicit Engine(EngineParts parts);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs the model's forward: `loss_fn` computes the micro-batch's mean loss. Under ZeRO-3 the parameters
  // outside the gather units are gathered around it, so there the forward must run inside it.
  torch::Tensor forward(const std::function<torch::Tensor()>& loss_fn);
  // The same in two calls, for a front end that runs the model itself (Python's engine(batch)): begin_forward(),
  // the model, then end_forward(whether any output requires grad, i.e. a backward will follow).
  void begin_forward();
  void end_forward(bool will_backward);

  // Inside forward: runs `unit`'s forward (one of InitOptions::gather_units). Under ZeRO-3 its parameters are
  // gathered first (prefetched once the order is known), gathered again before its backward and released after
  // each; other stages just call `unit_forward`. A unit's parameters must not be touched outside its run_unit
  // under ZeRO-3: between uses they hold no memory.
  // With the flops profiler counting, the unit's FLOPs are attributed to its name.
  torch::Tensor run_unit(const torch::nn::Module& unit, const std::function<torch::Tensor()>& unit_forward);
  // The same for unit `unit` of ModelTensors::units (its index).
  torch::Tensor run_unit(int unit, const std::function<torch::Tensor()>& unit_forward);
  // run_unit in parts, for a front end whose units run their forwards themselves (Python's module hooks): enter
  // before the unit's forward, leave after it with its tensor outputs (see ZeroStage). fetch_param: a parameter read
  // outside its unit's forward (ZeroStage::fetch_param). All three do nothing outside ZeRO-3.
  void enter_unit(int unit) { stage_->enter_unit(unit); }
  void leave_unit(int unit, const std::vector<torch::Tensor>& outputs) { stage_->leave_unit(unit, outputs); }
  void fetch_param(const torch::Tensor& param) { stage_->fetch_param(param); }

  // Inside forward: block(input) with activation checkpointing (DeepSpeed's deepspeed.checkpointing.checkpoint):
  // only `input` is kept, in the form the config's activation_checkpointing section asks for, and the block runs
  // again during backward with the same random draws. Under ZeRO-3 call it inside the block's run_unit, so its
  // parameters are gathered for the recompute. See ActivationCheckpointing::checkpoint for what `block` must be.
  torch::Tensor checkpoint(ActivationCheckpointing::Block block, const torch::Tensor& input) {
    return checkpointing_->checkpoint(std::move(block), input);
  }
  // The same for a block of several tensor inputs and results (the Python front end's checkpoint(function, *args)).
  std::vector<torch::Tensor> checkpoint(ActivationCheckpointing::ListBlock block,
                                        const std::vector<torch::Tensor>& inputs) {
    return checkpointing_->checkpoint(std::move(block), inputs);
  }
  CheckpointStats checkpoint_stats() const { return checkpointing_->stats(); }

  // comms_logger: what every collective of this rank cost so far (null when the logger is off). Its summary is also
  // logged when the engine is destroyed.
  const CommsLogger* comms_logger() const { return observer_->comms_logger(); }

  // flops_profiler: the profiled step (flops_profiler.profile_step), once it has run; step 0 before.
  const FlopsProfile& flops_profile() const { return observer_->flops_profile(); }

  // Scales the loss (loss scale / gradient_accumulation_steps) and runs backward; the stage takes the gradients
  // (a flat buffer in stages 0-1, reduced bucket by bucket as they appear in stages 2-3).
  void backward(const torch::Tensor& loss);
  // A pipeline stage's backward (PipelineEngine): autograd from `outputs` with `grads`, the gradients the next stage
  // sent back, already scaled by its loss's backward. Nothing is scaled here and no loss is counted.
  void backward_from(const std::vector<torch::Tensor>& outputs, const std::vector<torch::Tensor>& grads);

  // Ends the micro-step. On an accumulation boundary it updates the parameters and returns true (false when the
  // step was skipped for overflow); off the boundary it does nothing and returns false.
  bool step();

  // Whether this micro-step's step() updates the parameters: every gradient_accumulation_steps-th micro-step, unless
  // set_gradient_accumulation_boundary says otherwise.
  bool is_gradient_accumulation_boundary() const;

  // DeepSpeed's override of the count, kept until set again (Hugging Face Accelerate sets it before every backward,
  // true at the end of an epoch whose batches are not a multiple of gradient_accumulation_steps). A step on an
  // early boundary applies the micro-steps accumulated so far, each scaled by 1/gradient_accumulation_steps as
  // always (as DeepSpeed's). std::nullopt: back to the count.
  void set_gradient_accumulation_boundary(std::optional<bool> is_boundary) { boundary_override_ = is_boundary; }

  const Config& config() const { return config_; }
  // The run's log: InitOptions::log, by default stderr on the run's first rank.
  void log(const std::string& line) const { observer_->log(line); }
  Comm& comm() { return layout_->data(); }
  int rank() const { return layout_->data().rank(); }
  int world_size() const { return layout_->data().world_size(); }
  torch::ScalarType compute_dtype() const { return model_.dtype; }

  int64_t global_steps() const { return progress_.global_steps; }
  int64_t micro_steps() const { return progress_.micro_steps; }
  int64_t skipped_steps() const { return progress_.skipped_steps; }
  double lr() const;                                 // the lr the next optimizer step will use
  // The lr of the next optimizer steps, from a schedule the program runs itself (Python's client lr_scheduler).
  // std::logic_error when the config has a "scheduler": one schedule drives the lr, not two.
  void set_lr(double lr);
  // The lr of InitOptions::param_groups[group] from the next optimizer step on (a client schedule moving each group's
  // lr); std::logic_error under a config "scheduler", std::invalid_argument for a group that does not exist.
  void set_group_lr(size_t group, double lr);
  // The lr each of InitOptions::param_groups steps with next: its own, or lr() where it has none.
  std::vector<double> group_lrs() const;
  double loss_scale() const { return scaler_->scale(); }
  const StepReport& last_step() const { return last_step_; }
  ModelStateMemory memory() const;
  // memory_breakdown's numbers for this rank; activations are measured once a CpuMemoryTracker is
  // installed (memory_breakdown installs one).
  MemoryBreakdown memory_breakdown() const;
  // Every rank's memory_breakdown, in rank order, in one exchange: a collective, so every rank must call it.
  std::vector<MemoryBreakdown> memory_breakdown_all_ranks() const;
  StageTimers stage_timers() const { return stage_->timers(); }
  // offload_optimizer nvme: the optimizer state's swap file (all zero otherwise).
  StateStore::SwapStats optimizer_swap() const;

  // fn(name, value) for every trainable parameter with its whole current value, in the compute dtype. Under
  // ZeRO-3 each parameter is assembled from the ranks' shards for the call, one at a time, so every rank must call
  // it; elsewhere (and for ZeRO-3's persistent parameters) they are the model's own tensors.
  void visit_parameters(const ZeroStage::ParamVisitor& fn) { stage_->visit_params(fn); }

  // DeepSpeed's save_16bit_model: every trainable parameter, whole, in the compute dtype, as one safetensors file
  // written by rank 0 (names as the model's named_parameters()). Collective: every rank calls it. Under ZeRO-3 it
  // needs zero_optimization.stage3_gather_16bit_weights_on_model_save, as in DeepSpeed, and then streams one
  // parameter at a time (never the whole model, nor a whole block, in memory); without the key it logs why and
  // returns false.
  bool save_16bit_model(const std::string& path);

  // Checkpoints. Collective: every rank calls them, at an accumulation boundary.
  //
  // save_checkpoint writes `save_dir/<tag>/` (tag default "global_step<N>"): one safetensors shard per rank with
  // its fp32 master, optimizer state and (16-bit training) compute-dtype weights, each as fragments of named
  // parameters, plus its CPU generator state (and, training on a GPU, that GPU's); and a manifest (JSON) with the
  // config, counters, loss scaler and every tensor's CRC-32. `save_dir/latest` names the tag only once all of it is
  // fsynced and in place, so a crash during a save leaves the previous checkpoint and `latest` intact (re-saving an
  // existing tag swaps the new one in atomically). `client_state` is stored as is. Rank 0's file also holds the
  // module's buffers and frozen parameters, whole (rank 0's values, as DeepSpeed's module state). Returns the tag
  // directory. Throws CheckpointError on every rank when any rank fails; other tags and `latest` are untouched.
  std::string save_checkpoint(const std::string& save_dir, const std::string& tag = "",
                              const nlohmann::json& client_state = nullptr,
                              const CheckpointSaveOptions& options = {}) {
    layout_->check_checkpointable("save_checkpoint");
    return checkpointer_->save(save_dir, tag, client_state, options);
  }

  // Loads `load_dir/<tag>` (`tag` empty: the one `latest` names) into this engine, whatever world size and ZeRO
  // stage wrote it: each rank reads the fragments its own partition needs, checking every one against its CRC.
  // Restores master weights (and from them the compute-dtype weights), optimizer state, the step counters, the LR
  // schedule's position, the loss scaler and each rank's CPU generator and, on a GPU, its CUDA generator (ranks
  // the writer did not have keep theirs, and so does a GPU run loading a checkpoint written on CPU); `options` says
  // what to leave as it is (DeepSpeed's load_optimizer_states, load_lr_scheduler_states, load_module_only,
  // load_module_strict). Throws
  // CheckpointError naming the file and the problem — missing tag or shard, truncated or corrupt shard, a manifest
  // written for another model — on every rank, leaving the engine as it was.
  LoadedCheckpoint load_checkpoint(const std::string& load_dir, const std::string& tag = "",
                                   const CheckpointLoadOptions& options = {}) {
    layout_->check_checkpointable("load_checkpoint");
    return checkpointer_->load(load_dir, tag, options);
  }

  // Sets every trainable parameter to `source(name, shape)`'s value (whole, that shape, any dtype) — pretrained
  // weights, e.g. HF GPT-2's (HfGpt2Weights). The master copy and the compute-dtype weights change on every stage;
  // optimizer state and counters do not. Each rank asks only for the parameters its partition holds and keeps one
  // at a time, so under ZeRO-3 no rank holds the model. Collective; throws on every rank when any rank's source
  // throws, leaving the weights as they were.
  // With `wanted`, only the parameters it names (by name) are set; the others keep their values.
  using WeightSource = Checkpointer::WeightSource;
  void load_weights(const WeightSource& source, const std::function<bool(const std::string&)>& wanted = nullptr) {
    layout_->refuse_split_model("load_weights");
    checkpointer_->load_weights(source, wanted);
  }

  // The trainable parameters' names and whole shapes (a tensor-parallel rank's: its slices'), in registration order.
  const std::vector<ParamEntry>& param_entries() const { return model_.params; }

  // As load_weights, with each rank's own values: under tensor parallelism `source` gives this rank's slice of a
  // sliced parameter (the shape this rank holds), so nothing is read as whole — what GatheredParameters writes back.
  void write_own_weights(const WeightSource& source, const std::function<bool(const std::string&)>& wanted) {
    checkpointer_->load_weights(source, wanted);
  }

  // `param`'s whole current value in the compute dtype (DeepSpeed's GatheredParameters). Under ZeRO-3 it is
  // assembled from the ranks' shards, so it is collective there (every rank, same parameters, same order) and not
  // allowed between a forward and its backward; elsewhere it is the parameter itself.
  torch::Tensor whole_parameter(const torch::Tensor& param) { return stage_->whole_param(param); }

  // The frozen parameters' names and whole shapes (under ZeRO-3 their tensors are empty between uses).
  std::vector<ParamEntry> frozen_entries() const {
    std::vector<ParamEntry> out;
    for (const auto& t : model_.module_state) {
      if (t.frozen) out.push_back({t.name, t.shape});
    }
    return out;
  }
  // `value` (whole) becomes frozen parameter `name`'s on this rank: under ZeRO-3 this rank's shard of it. Every
  // data-parallel rank writes the same value (GatheredParameters' modifier rank broadcasts it first).
  void write_frozen(const std::string& name, const torch::Tensor& value);

  // Samples consumed so far (global batch × optimizer boundaries): where the data stands.
  int64_t global_samples() const { return progress_.global_samples; }

 private:
  void update(StepReport& report);
  // Around each micro-step's autograd: the stage's hooks and the phase times.
  void run_backward(const std::function<void()>& autograd);
  void refuse_if_forward_only(const char* call) const;  // std::logic_error for InitOptions::forward_only engines
  // The lines a steps_per_print line is followed by (memory_breakdown: every rank's, in one exchange).
  std::vector<std::string> print_details() const;

  Config config_;
  EngineModel model_;
  std::unique_ptr<ParallelLayout> layout_;   // the groups; how the norm and loss are reduced across them
  std::unique_ptr<StepObserver> observer_;   // timers, profilers, memory, monitors: watches, never changes a step
  std::unique_ptr<FlatParams> flat_;         // stages 0-2: every parameter as a view of one buffer
  std::unique_ptr<ZeroStage> stage_;
  std::unique_ptr<FlatOptimizer> optimizer_;
  std::unique_ptr<OptimizerStep> optimizer_step_;  // in place, or offloaded to the host
  std::unique_ptr<LRSchedule> schedule_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<ActivationCheckpointing> checkpointing_;
  std::unique_ptr<Checkpointer> checkpointer_;
  TrainingProgress progress_;
  std::optional<bool> boundary_override_;  // set_gradient_accumulation_boundary's
  torch::Tensor loss_sum_;  // () fp32 on the model's device: this rank's micro-step losses since the last boundary
  StepReport last_step_;
};

// Builds the engine (assemble, then Engine): casts the model to the compute dtype, flattens its parameters, builds
// the parts from `config`. Throws ConfigError for config values the engine does not support yet.
std::unique_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model, const Config& config,
                                   InitOptions options = {});
std::unique_ptr<Engine> initialize(ModelTensors model, const Config& config, InitOptions options = {});

}  // namespace dscpp
