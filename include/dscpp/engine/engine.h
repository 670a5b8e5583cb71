// Engine: one training step, in order — backward (scale, accumulate) → step (reduce, check overflow, clip,
// optimizer on the master partition, publish params, advance the schedule). The stage, scaler, optimizer and
// schedule are chosen once from the config; the engine only sequences them (and hands checkpoints to its
// Checkpointer). It trains a model's tensors (ModelTensors), which a LibTorch module or a Python nn.Module gives.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/activation/checkpointing.h"
#include "dscpp/checkpoint/manifest.h"
#include "dscpp/comm/comm.h"
#include "dscpp/comm/comms_logger.h"
#include "dscpp/config/config.h"
#include "dscpp/engine/checkpointer.h"
#include "dscpp/engine/memory_report.h"
#include "dscpp/engine/model_tensors.h"
#include "dscpp/engine/partitioned_init.h"
#include "dscpp/engine/progress.h"
#include "dscpp/monitor/device_memory.h"
#include "dscpp/monitor/flops_profiler.h"
#include "dscpp/monitor/monitor.h"
#include "dscpp/monitor/wall_clock.h"
#include "dscpp/offload/optimizer_offload.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/precision/loss_scaler.h"
#include "dscpp/schedule/lr_schedule.h"
#include "dscpp/zero/flat_params.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

// Parameters, by name, whose weight decay or lr differs from the optimizer section's: typically no decay for biases
// and norms, or a smaller lr for the lower layers. A group's lr holds until Engine::set_group_lr moves it; a config
// "scheduler" sets every group's lr, as DeepSpeed's schedulers do, so a group's own lr is not used under one.
struct OptimizerParamGroup {
  std::vector<std::string> params;
  std::optional<double> weight_decay;
  std::optional<double> lr;
};

struct InitOptions {
  std::shared_ptr<Comm> comm;                        // default: init_comm(DistEnv::from_env())
  std::optional<OptimizerConfig> client_optimizer;   // used when the config has no "optimizer" section
  std::function<void(const std::string&)> log;       // rank 0's log sink; default: stderr on rank 0
  // ZeRO-3: submodules whose parameters are gathered and released together (a transformer block each, as FSDP2's
  // fully_shard units). Run each one's forward through Engine::run_unit. Parameters outside every unit are
  // gathered for the whole forward and backward. Ignored by stages 0-2. A LibTorch module's only: an engine built
  // from ModelTensors takes its units from ModelTensors::units.
  std::vector<std::shared_ptr<torch::nn::Module>> gather_units;
  // ZeRO-3: the model was built partitioned through this (DeepSpeed's zero.Init). Its units become the gather
  // units (when gather_units is empty), its comm the engine's, and its shards the stage's partition (a unit the
  // gather units regroup is gathered whole while its new group is built). Needs zero_optimization.stage 3.
  std::shared_ptr<PartitionedInit> partitioned;
  // activation_checkpointing.partition_activations: the ranks whose activations are the same (a tensor- or
  // sequence-parallel group, DeepSpeed's mpu), over which each checkpointed input is split. Data-parallel ranks see
  // different data, so without such a group there is nothing to split and the key changes nothing, as in DeepSpeed
  // without an mpu.
  std::shared_ptr<Comm> activation_partition_group;
  // Parameter groups (DeepSpeed's and torch's param_groups): parameters with settings of their own; the others take
  // the optimizer section's. Each name a trainable parameter's, in one group at most.
  std::vector<OptimizerParamGroup> param_groups;
  // Tensor parallelism (ParallelGroups::model; `comm` is then the data-parallel group, ZeRO's): the ranks that hold
  // slices of one model and compute the same loss. The gradient norm clipping uses is the whole model's — each
  // slice once, each parameter every slice holds whole (norms, row-parallel biases) once — and
  // activation_partition_group defaults to it. Checkpoints need model_parallel_slices for every sliced parameter.
  std::shared_ptr<Comm> model_parallel_group;
  // The trainable parameters, by name, that are slices over model_parallel_group; the others are whole on every
  // model-parallel rank. Names alone (Python's mpu, whose parameters do not say where their slice sits) train, but
  // cannot be checkpointed: prefer model_parallel_slices.
  std::set<std::string> model_parallel_params;
  // Parameters that require a gradient but that the optimizer leaves alone, by name: DeepSpeed's model_parameters or
  // client optimizer naming a subset of the trainable parameters. They are kept as frozen parameters are (whole, out
  // of ZeRO's partitions, their values unchanged); autograd still fills their .grad. Each must name a trainable
  // parameter (std::invalid_argument otherwise).
  std::set<std::string> untrained_params;
  // Where each sliced parameter sits in the whole one (TensorSlice::part; tensor_parallel_slices() of the model's
  // layers): checkpoints write and read the slices as parts of the whole named parameters, so a checkpoint of one
  // layout loads on any other. Its names count as model_parallel_params.
  std::map<std::string, TensorSlice> model_parallel_slices;
  // Model or pipeline parallelism: every rank of the run (ParallelGroups::world), over which checkpoints are saved
  // and loaded together (PipelineEngine sets it).
  std::shared_ptr<Comm> world_group;
  // Pipeline parallelism (PipelineEngine sets it; `comm` is then the data-parallel group): the ranks that hold the
  // other stages of this rank's replica (ParallelGroups::pipe). The gradient norm and the reported loss are the whole
  // pipeline's: ‖g‖² and the loss (which only the last stage computes) are summed over it.
  std::shared_ptr<Comm> pipeline_group;
  // Trainable parameters whose gradient another stage counts in the norm: this stage's copy of a tied weight (the
  // GPT's embedding, on the first and the last stage) that an earlier stage holds too.
  std::set<std::string> norm_counted_elsewhere;
  // Mixture of Experts with expert parallelism (moe::make_expert_groups over `comm`): the expert-data-parallel group
  // — the D / ep_size ranks that hold the same experts — and the trainable parameters averaged over it instead of
  // `comm`: the experts, by name (moe::expert_parameter_names). A LibTorch module's MoE layers name their experts
  // themselves when expert_params is empty. Under ZeRO 1-2 the experts' optimizer state and gradients are
  // partitioned over this group; ZeRO-3 refuses expert parallelism. Without the group (ep_size 1) experts are
  // parameters like any other.
  std::shared_ptr<Comm> expert_data_parallel_group;
  std::set<std::string> expert_params;
};

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

class Engine {
 public:
  // A LibTorch module: its tensors (model_tensors), the units InitOptions names, and a model built partitioned.
  Engine(std::shared_ptr<torch::nn::Module> model, Config config, InitOptions options);
  // Any model given as its tensors (the Python front end's way in). InitOptions::gather_units and ::partitioned
  // must be empty: they name LibTorch modules.
  Engine(ModelTensors model, Config config, InitOptions options);
  ~Engine();
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
  const CommsLogger* comms_logger() const { return comms_logger_.get(); }

  // flops_profiler: the profiled step (flops_profiler.profile_step), once it has run; step 0 before.
  const FlopsProfile& flops_profile() const { return flops_profile_; }

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
  Comm& comm() { return *comm_; }
  int rank() const { return comm_->rank(); }
  int world_size() const { return comm_->world_size(); }
  torch::ScalarType compute_dtype() const { return dtype_; }

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
  StateStore::SwapStats optimizer_swap() const { return offload_ ? offload_->store().stats() : StateStore::SwapStats{}; }

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
    check_checkpointable("save_checkpoint");
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
    check_checkpointable("load_checkpoint");
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
    check_not_model_parallel("load_weights");
    checkpointer_->load_weights(source, wanted);
  }

  // The trainable parameters' names and whole shapes (a tensor-parallel rank's: its slices'), in registration order.
  const std::vector<ParamEntry>& param_entries() const { return params_; }

  // As load_weights, with each rank's own values: under tensor parallelism `source` gives this rank's slice of a
  // sliced parameter (the shape this rank holds), so nothing is read as whole — what GatheredParameters writes back.
  void write_own_weights(const WeightSource& source, const std::function<bool(const std::string&)>& wanted) {
    checkpointer_->load_weights(source, wanted);
  }

  // `param`'s whole current value in the compute dtype (DeepSpeed's GatheredParameters). Under ZeRO-3 it is
  // assembled from the ranks' shards, so it is collective there (every rank, same parameters, same order) and not
  // allowed between a forward and its backward; elsewhere it is the parameter itself.
  torch::Tensor whole_parameter(const torch::Tensor& param) { return stage_->whole_param(param); }

  // Samples consumed so far (global batch × optimizer boundaries): where the data stands.
  int64_t global_samples() const { return progress_.global_samples; }

 private:
  // Both constructors end here: casts, joins the job, partitions, builds optimizer, schedule, scaler, monitors.
  void build(ModelTensors model, InitOptions options, std::vector<PrepartitionedUnit> prepartitioned);
  void update(StepReport& report);
  // InitOptions::model_parallel_group and _params, pipeline_group and norm_counted_elsewhere: the groups the norm
  // sums over and which gradients this rank counts in it.
  void set_model_parallel(const InitOptions& options);
  // Around each micro-step's autograd: the stage's hooks and the phase times.
  void run_backward(const std::function<void()>& autograd);
  // InitOptions::expert_data_parallel_group and expert_params: which trainable parameters (`names`) are experts,
  // checked against the groups and the stage. Empty without expert parallelism.
  std::vector<bool> expert_flags(const InitOptions& options, const std::vector<std::string>& names);
  // Refuses what a tensor- or pipeline-parallel run cannot do yet, naming `what`.
  void check_not_model_parallel(const std::string& what) const;
  // Refuses a checkpoint of a model-parallel run without what it needs (InitOptions::world_group, a slice of every
  // sliced parameter), naming `what` and the option.
  void check_checkpointable(const std::string& what) const;
  // InitOptions::param_groups as ranges of this rank's master partition for the optimizer.
  void set_param_groups(const std::vector<OptimizerParamGroup>& groups);
  void log_step(const StepReport& report);
  // Rank 0: this step's events to every monitor the config enables (DeepSpeed's names, x = global samples).
  void write_monitors(const StepReport& report);
  // flops_profiler: completes flops_profile_ for the profiled step (measuring the peak) and prints it.
  void profile_flops(const StepReport& report);
  // Seconds since `start_ns`, added to `phase` of the current optimizer step. With wall_clock_breakdown the device
  // is synchronized first, so asynchronous GPU work is counted where it ran.
  void add_time(Phase phase, int64_t start_ns);

  Config config_;
  std::shared_ptr<torch::nn::Module> module_;  // a LibTorch model, kept alive; null for ModelTensors
  std::map<const torch::nn::Module*, int> module_unit_;  // a LibTorch model's gather units: index in the units
  std::vector<std::string> unit_names_;  // per gather unit, for the flops profiler's scopes
  std::vector<ParamEntry> params_;       // the trainable parameters' names and shapes, in registration order
  std::shared_ptr<Comm> comm_;  // with comms_logger, the logging decorator around the process group's comm
  std::shared_ptr<CommsLogger> comms_logger_;
  std::function<void(const std::string&)> log_;
  torch::ScalarType dtype_;
  std::unique_ptr<FlatParams> flat_;  // stages 0-2: every parameter as a view of one buffer; stage 3 has none
  std::unique_ptr<ZeroStage> stage_;
  std::unique_ptr<FlatOptimizer> optimizer_;
  std::unique_ptr<OptimizerOffload> offload_;  // offload_optimizer: the step runs on the host, by sub-group
  std::unique_ptr<LRSchedule> schedule_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<ActivationCheckpointing> checkpointing_;
  std::unique_ptr<FlopsCounter> flops_counter_;  // during the profiled step's forwards
  FlopsProfile flops_profile_;
  std::vector<std::unique_ptr<Monitor>> monitors_;  // rank 0 only
  std::unique_ptr<Checkpointer> checkpointer_;
  // Tensor parallelism (InitOptions::model_parallel_group; null without): and, per slot of the stage's layout,
  // whether this rank counts that parameter's gradient in the norm (its slices on every model-parallel rank, whole
  // parameters on model-parallel rank 0 only).
  std::shared_ptr<Comm> model_group_;
  std::shared_ptr<Comm> pipe_group_;  // pipeline parallelism (InitOptions::pipeline_group); null without
  std::vector<bool> counted_in_norm_;  // filled when either group is there
  std::string unsliced_param_;         // a sliced parameter without a TensorSlice ("" when every one has one)
  std::shared_ptr<Comm> world_group_;  // InitOptions::world_group
  // Mixture of Experts: the largest ep_size of a LibTorch model's MoE layers (1 without), and the expert
  // parallelism the engine runs (1 without InitOptions::expert_data_parallel_group).
  int model_expert_parallel_ = 1;
  int expert_parallel_ = 1;

  TrainingProgress progress_;
  std::optional<bool> boundary_override_;  // set_gradient_accumulation_boundary's
  int64_t optimizer_state_bytes_ = 0;
  torch::Device device_{torch::kCPU};  // where the parameters (and so training) live
  torch::Tensor loss_sum_;    // () fp32: sum of this rank's micro-step losses since the last boundary
  StepReport last_step_;
  int64_t last_log_time_ns_ = 0;
  PhaseTimes step_times_;    // the optimizer step in progress
  PhaseTimes print_window_;  // since the last steps_per_print line
  int64_t forward_start_ns_ = 0;
  // memory_breakdown on a GPU: its caching allocator's counts (on the CPU, CpuMemoryTracker's).
  std::optional<DeviceMemoryCounter> device_memory_;
  int64_t forward_start_bytes_ = 0;  // tensor bytes held (CPU or device counter) when the micro-step's forward began
  int64_t activations_peak_ = -1;    // MemoryBreakdown::activations_peak
};

// Builds the engine: casts the model to the compute dtype, flattens its parameters, builds stage, optimizer,
// schedule and scaler from `config`. Throws ConfigError for config values the engine does not support yet.
std::unique_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model, const Config& config,
                                   InitOptions options = {});
std::unique_ptr<Engine> initialize(ModelTensors model, const Config& config, InitOptions options = {});

}  // namespace dscpp
