// Engine: sequences one training step over the parts chosen at initialize (see engine.h for the order).
#include "dscpp/engine/engine.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_set>

#include <torch/cuda.h>

#include "dscpp/checkpoint/safetensors.h"
#include "dscpp/engine/components.h"
#include "dscpp/engine/device.h"
#include "dscpp/engine/host_malloc.h"
#include "dscpp/fault/kill_point.h"
#include "dscpp/moe/moe_layer.h"
#include "dscpp/monitor/memory_tracker.h"
#include "dscpp/monitor/step_log.h"
#include "dscpp/optim/cpu_adam.h"

namespace dscpp {
namespace {

void check_batch(const Config& config, int world_size) {
  const auto& b = config.batch;
  if (b.train_batch_size != b.micro_batch * b.grad_accum * world_size) {
    throw ConfigError("train_batch_size " + std::to_string(b.train_batch_size) + " != micro " +
                      std::to_string(b.micro_batch) + " × grad_accum " + std::to_string(b.grad_accum) +
                      " × world_size " + std::to_string(world_size) +
                      ": the config was resolved for another world size");
  }
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Makes frozen parameters and buffers (running statistics, masks) rank 0's on every rank, as DeepSpeed does; the
// trainable parameters go through the stage, which starts every rank from rank 0's values too.
void broadcast_rest(const std::vector<torch::Tensor>& tensors, Comm& comm) {
  torch::NoGradGuard no_grad;
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    auto contiguous = t.contiguous();
    comm.broadcast(contiguous, 0).wait();
    if (!contiguous.is_same(t)) t.copy_(contiguous);
  }
}

// A model built partitioned (PartitionedInit): makes its comm the engine's and its units the gather units (unless the
// program named them), and hands its units over (adopt_prepartitioned checks they fit the config).
std::vector<PrepartitionedUnit> take_partitioned(InitOptions& options) {
  if (!options.partitioned) return {};
  if (options.comm && options.comm != options.partitioned->comm()) {
    throw std::invalid_argument("dscpp::initialize: InitOptions::comm is not the comm the model was built "
                                "partitioned over (InitOptions::partitioned); pass one of them");
  }
  options.comm = options.partitioned->comm();
  auto units = options.partitioned->take_units();
  if (options.gather_units.empty()) {
    for (const auto& unit : units) options.gather_units.push_back(unit.module);
  }
  return units;
}

// Units built partitioned, as the engine takes them. A unit made whole since (GatheredParameters, an init function
// that read its weights) is whole parameters like any other; one holding a parameter frozen since is gathered whole,
// as frozen parameters are whole on every rank; the rest get their shapes back (views of their released buffers)
// for Stage 3 to adopt or regroup.
std::vector<PrepartitionedUnit> adopt_prepartitioned(std::vector<PrepartitionedUnit> units, const ModelTensors& model,
                                                     const std::set<std::string>& untrained, const Config& config,
                                                     Comm* comm) {
  if (units.empty()) return units;
  const auto dtype = to_scalar_type(config.compute_dtype());
  if (config.zero.stage != 3) {
    throw ConfigError("zero_optimization.stage is " + std::to_string(config.zero.stage) +
                      ": the model was built partitioned (zero.Init), which needs stage 3");
  }
  if (!comm) throw std::logic_error("dscpp::initialize: a model built partitioned comes with the comm it used");
  std::unordered_set<const c10::TensorImpl*> frozen;
  for (const auto& p : model.params) {
    if (!p.tensor.requires_grad() || untrained.count(p.name)) frozen.insert(p.tensor.unsafeGetTensorImpl());
  }
  std::vector<PrepartitionedUnit> out;
  for (auto& unit : units) {
    if (unit.params.empty() || unit.whole) continue;
    if (unit.buffer.scalar_type() != dtype) {
      throw ConfigError("the model was built partitioned (zero.Init) in " +
                        std::string(c10::toString(unit.buffer.scalar_type())) + " but this config computes in " +
                        to_string(config.compute_dtype()) + ": build it with the config given to initialize");
    }
    const bool has_frozen = std::any_of(unit.params.begin(), unit.params.end(), [&](const torch::Tensor& p) {
      return frozen.count(p.unsafeGetTensorImpl()) > 0;
    });
    if (has_frozen) {
      gather_whole(unit, *comm);
      continue;
    }
    point_into_buffer(unit);
    out.push_back(std::move(unit));
  }
  return out;
}

}  // namespace

Engine::Engine(std::shared_ptr<torch::nn::Module> model, Config config, InitOptions options)
    : config_(std::move(config)), module_(std::move(model)) {
  if (!module_) throw std::invalid_argument("dscpp::initialize: model is null");
  check_supported(config_);
  auto prepartitioned = take_partitioned(options);
  auto tensors = model_tensors(*module_, options.gather_units);
  for (size_t u = 0; u < options.gather_units.size(); ++u) {
    module_unit_.emplace(options.gather_units[u].get(), static_cast<int>(u));
  }
  options.gather_units.clear();
  options.partitioned.reset();
  if (options.expert_params.empty()) {
    for (auto& name : moe::expert_parameter_names(*module_)) options.expert_params.insert(std::move(name));
  }
  model_expert_parallel_ = moe::expert_parallel_size(*module_);
  build(std::move(tensors), std::move(options), std::move(prepartitioned));
}

Engine::Engine(ModelTensors model, Config config, InitOptions options) : config_(std::move(config)) {
  if (!options.gather_units.empty() || options.partitioned) {
    throw std::invalid_argument("dscpp::initialize: InitOptions::gather_units and InitOptions::partitioned name "
                                "LibTorch modules; an engine built from ModelTensors takes ModelTensors::units");
  }
  check_supported(config_);
  auto prepartitioned = std::move(model.prepartitioned);
  build(std::move(model), std::move(options), std::move(prepartitioned));
}

void Engine::build(ModelTensors model, InitOptions options, std::vector<PrepartitionedUnit> prepartitioned) {
  comm_ = std::move(options.comm);
  log_ = std::move(options.log);
  dtype_ = to_scalar_type(config_.compute_dtype());
  for (const auto& name : options.untrained_params) {
    const bool trainable = std::any_of(model.params.begin(), model.params.end(), [&](const NamedTensor& p) {
      return p.name == name && p.tensor.requires_grad();
    });
    if (!trainable) {
      throw std::invalid_argument("dscpp::initialize: InitOptions::untrained_params names '" + name +
                                  "', which is not a parameter that requires a gradient");
    }
  }
  prepartitioned = adopt_prepartitioned(std::move(prepartitioned), model, options.untrained_params, config_,
                                        comm_.get());
  tune_host_malloc();  // once per process: the host-side blocks every step reuses stay in the heap
  const auto optimizer_config = config_.optimizer ? config_.optimizer : options.client_optimizer;
  if (!optimizer_config) {
    throw ConfigError("optimizer: the config has no \"optimizer\" section and the program passed none; add e.g. "
                      "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}");
  }

  // Cast first, then flatten: the flat buffers are allocated in the compute dtype and the params become views.
  cast_floating(model, dtype_);
  std::vector<torch::Tensor> params;  // trainable: what ZeRO partitions and the optimizer updates
  std::vector<std::string> names;
  std::vector<torch::Tensor> rest;    // frozen parameters and buffers
  std::vector<CheckpointedState::ModuleTensor> module_state;  // the same, named, for checkpoints
  for (const auto& p : model.params) {
    if (p.tensor.requires_grad() && !options.untrained_params.count(p.name)) {
      params.push_back(p.tensor);
      names.push_back(p.name);
      params_.push_back({p.name, p.tensor.sizes().vec()});
    } else {
      rest.push_back(p.tensor);
      module_state.push_back({p.name, p.tensor, /*frozen=*/true});
    }
  }
  std::set<std::string> non_persistent = model.non_persistent_buffers;
  for (const auto& b : model.buffers) {
    rest.push_back(b.tensor);
    if (non_persistent.erase(b.name) == 0) module_state.push_back({b.name, b.tensor, /*frozen=*/false});
  }
  if (!non_persistent.empty()) {
    throw std::invalid_argument("dscpp::initialize: ModelTensors::non_persistent_buffers names '" +
                                *non_persistent.begin() + "', which is not one of the model's buffers");
  }
  for (const auto& unit : model.units) unit_names_.push_back(unit.name);
  // Where training runs: the parameters' device. As DeepSpeed does, a rank training on a GPU makes the GPU its
  // LOCAL_RANK names current (so streams, the caching allocator and NCCL use it); a model on another GPU is an
  // error, not a run whose every collective crosses devices. A CPU run never touches CUDA.
  const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params.front().device();
  if (device.is_cuda() && comm_) {
    make_current(device);  // the program chose the device (and joined the job) itself
  } else if (device.is_cuda()) {
    const DistEnv env = DistEnv::from_env();
    const torch::Device mine = rank_device("cuda", env.local_rank);
    make_current(mine);
    if (device != mine) {
      throw std::invalid_argument("dscpp::initialize: the model is on " + device.str() + " but this rank (LOCAL_RANK " +
                                  std::to_string(env.local_rank) + ") trains on " + mine.str() +
                                  ": move the model there first");
    }
  }
  device_ = device;
  if (!comm_) {
    // The backend follows the data: NCCL for CUDA parameters, Gloo for CPU ones (and ranks sharing a GPU).
    const DistEnv env = DistEnv::from_env();
    comm_ = init_comm(env, comm_backend_for(device, env.local_size));
  }
  if (!log_) {
    log_ = [rank = comm_->rank()](const std::string& line) {
      if (rank == 0) std::cerr << line << std::endl;
    };
  }
  check_batch(config_, comm_->world_size());
  if (config_.comms_logger.enabled) {
    // debug: every rank prints its own operations, so its sink is this rank's stderr rather than rank 0's log.
    std::function<void(const std::string&)> sink = log_;
    if (config_.comms_logger.debug) sink = [](const std::string& line) { std::cerr << line << std::endl; };
    comms_logger_ = std::make_shared<CommsLogger>(config_.comms_logger, comm_->rank(), comm_->world_size(), sink);
    comm_ = make_logged_comm(comm_, comms_logger_);
  }

  StageContext context;
  context.comm = comm_;
  if (config_.communication_data_type) context.comm_dtype = to_scalar_type(*config_.communication_data_type);
  context.overlap_comm = config_.zero.overlap_comm;
  context.reduce_scatter = config_.zero.reduce_scatter;
  context.allgather_bucket_numel = config_.zero.allgather_bucket_size;
  const bool offload_optimizer = config_.zero.offload_optimizer.device != OffloadDevice::kNone;
  context.offload_optimizer = offload_optimizer;
  context.pin_memory = config_.zero.offload_optimizer.pin_memory;
  context.master_in_store = config_.zero.offload_optimizer.device == OffloadDevice::kNvme;
  set_param_offload(config_, comm_->rank(), context);
  set_gradient_averaging(config_, comm_->world_size(), context);
  if (config_.zero.stage == 3) {
    const auto& experts = options.expert_data_parallel_group;
    const int ep = experts ? comm_->world_size() / std::max(1, experts->world_size()) : model_expert_parallel_;
    if (ep > 1) {
      throw std::invalid_argument("ZeRO stage 3 with expert parallelism (ep_size " + std::to_string(ep) +
                                  ") is not supported: stage 3 gathers every parameter over the data-parallel group, "
                                  "whose ranks hold different experts; use ZeRO stage 0, 1 or 2");
    }
    // Stage 3 partitions the parameters group by group: no whole-model buffer exists on any rank.
    PartitionedModel partitioned{params, names, std::move(model.units), std::move(prepartitioned)};
    stage_ = make_stage3(context, std::move(partitioned), config_.zero);
  } else {
    // Communication groups are reduce_bucket_size elements: each is reduced (and, sharded, all-gathered) as one.
    const auto experts = expert_flags(options, names);
    flat_ = std::make_unique<FlatParams>(params, names, comm_->world_size(), dtype_, config_.zero.reduce_bucket_size,
                                         experts, expert_parallel_);
    if (expert_parallel_ > 1) context.expert_comm = options.expert_data_parallel_group;
    // Every rank starts from rank 0's weights, whatever each process initialised; the stage copies its master from
    // them. Experts differ between expert-parallel ranks: each comes from the first rank that holds it.
    if (expert_parallel_ == 1) {
      comm_->broadcast(flat_->params(), 0).wait();
    } else {
      for (const auto& g : flat_->layout().groups()) {
        auto values = flat_->params().narrow(0, g.offset, g.numel);
        context.comm_for(g).broadcast(values, 0).wait();
      }
    }
    context.flat = flat_.get();
    stage_ = make_zero_stage(config_.zero, context);
  }
  broadcast_rest(rest, *comm_);

  // Offloaded, the optimizer runs on the host over its store's slices; on NVMe it holds no state of its own.
  const int64_t partition = stage_->master_params().numel();
  const bool nvme = config_.zero.offload_optimizer.device == OffloadDevice::kNvme;
  // The kernels: one fused pass over p, g, m and v instead of the torch arithmetic's eight passes over memory (and,
  // on a GPU, their launches): the SIMD CPU Adam for master weights on the host (offloaded or not), torch's fused
  // Adam for master weights on a GPU. Other optimizers, and AMSGrad, keep the torch arithmetic (flat_adam.cpp).
  const auto kernels = offload_optimizer || stage_->master_params().device().is_cpu() ? OptimizerKernels::kCpuSimd
                                                                                      : OptimizerKernels::kFused;
  optimizer_ = make_flat_optimizer(*optimizer_config, nvme ? 0 : partition, stage_->master_params().options(), kernels);
  if (!options.param_groups.empty()) set_param_groups(options.param_groups);
  if (offload_optimizer) {
    offload_ = std::make_unique<OptimizerOffload>(*optimizer_, make_optimizer_store(config_, *stage_, *optimizer_,
                                                                                    comm_->rank()),
                                                  *stage_, dtype_);
  }
  const double base_lr = optimizer_config->lr();
  schedule_ = config_.scheduler ? make_lr_schedule(*config_.scheduler, base_lr) : std::make_unique<ConstantLR>(base_lr);
  scaler_ = make_loss_scaler(config_, log_);
  if (config_.memory_breakdown) {
    if (device_.is_cpu()) {
      CpuMemoryTracker::install();
    } else {
      device_memory_.emplace(device_);
    }
  }
  if (const int tp = config_.tensor_parallel_size; tp > 1) {
    const int given = options.model_parallel_group ? options.model_parallel_group->world_size() : 1;
    if (given != tp) {
      throw ConfigError("tensor_parallel.autotp_size: " + std::to_string(tp) + ", but the model-parallel group given "
                        "has " + std::to_string(given) + " rank(s). deepspeed.cpp slices no model by itself: build the "
                        "model tensor parallel (dscpp/parallel's layers) over a group of " + std::to_string(tp) +
                        " ranks and pass it as InitOptions::model_parallel_group, as gpt-train --tensor_parallel does");
    }
  }
  set_model_parallel(options);
  if (!options.activation_partition_group && model_group_) options.activation_partition_group = model_group_;
  checkpointing_ = std::make_unique<ActivationCheckpointing>(config_.activation_checkpointing,
                                                             options.activation_partition_group);
  for (auto& [name, tensor] : optimizer_->state_tensors()) optimizer_state_bytes_ += tensor.nbytes();
  // On the model's device (the master may be on the host, offloaded).
  loss_sum_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));

  // Rank 0 writes the monitors' files; every rank learns whether it could, so none is left waiting in a collective.
  using MonitorFactory = std::unique_ptr<Monitor> (*)(const MonitorConfig&);
  const std::vector<std::tuple<const char*, const MonitorConfig*, MonitorFactory>> monitors = {
      {"csv_monitor", &config_.csv_monitor, &make_csv_monitor},
      {"tensorboard", &config_.tensorboard, &make_tensorboard_monitor}};
  for (const auto& [key, monitor_config, make] : monitors) {
    if (!monitor_config->enabled) continue;
    std::string error;
    if (comm_->rank() == 0) {
      try {
        monitors_.push_back(make(*monitor_config));
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    if (comm_->side_all_gather({error.empty() ? 0 : 1})[0] != 0) {
      throw std::runtime_error(error.empty() ? std::string(key) + ": rank 0 could not create its directory (see its log)"
                                             : error);
    }
  }

  CheckpointedState checkpointed{config_, *comm_, *stage_, *optimizer_, offload_.get(), *scaler_, progress_,
                                 params_, std::move(module_state), dtype_, device_, log_};
  checkpointed.expert_parallel = expert_parallel_;
  if (model_group_ || pipe_group_) {
    // Each rank writes its own part of the model once: the whole shapes in the manifest, its slices as parts of
    // them, the parameters some other rank counts in the norm (and so holds too) left to that rank.
    checkpointed.world = world_group_;
    checkpointed.pipeline_parallel = pipe_group_ ? pipe_group_->world_size() : 1;
    checkpointed.tensor_parallel = model_group_ ? model_group_->world_size() : 1;
    checkpointed.writes_module_state = !model_group_ || model_group_->rank() == 0;
    const auto& slots = stage_->layout().slots();
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!counted_in_norm_[i]) checkpointed.written_elsewhere.insert(slots[i].name);
    }
    for (auto& p : checkpointed.params) {
      const auto it = options.model_parallel_slices.find(p.name);
      if (it == options.model_parallel_slices.end()) continue;
      checkpointed.slices.emplace(p.name, it->second);
      p.shape = it->second.whole_shape;
    }
  }
  checkpointer_ = std::make_unique<Checkpointer>(std::move(checkpointed));

  last_log_time_ns_ = now_ns();
  if (expert_parallel_ > 1) {
    int64_t experts = 0;
    for (const auto& slot : stage_->layout().slots()) experts += options.expert_params.count(slot.name);
    log_("[deepspeed.cpp] expert parallel " + std::to_string(expert_parallel_) + ": " + std::to_string(experts) +
         " of " + std::to_string(params_.size()) + " trainable parameters are experts, averaged and partitioned over " +
         std::to_string(options.expert_data_parallel_group->world_size()) + " rank(s) holding the same experts");
  }
  log_("[deepspeed.cpp] ZeRO stage " + std::to_string(stage_->stage()) + ", world size " +
       std::to_string(comm_->world_size()) + " (" + comm_->backend() + "), " + to_string(config_.compute_dtype()) +
       ": " + describe(memory()));
  if (const auto& param = config_.zero.offload_param; param.device != OffloadDevice::kNone) {
    log_(param.device == OffloadDevice::kCpu
             ? std::string("[deepspeed.cpp] offload_param cpu: the 16-bit parameter partition in host memory")
             : "[deepspeed.cpp] offload_param nvme: the 16-bit parameter partition swapped to " + param.nvme_path +
                   ", each group's shard read ahead of its gather");
  }
  if (config_.activation_checkpointing.partition_activations &&
      !(options.activation_partition_group && options.activation_partition_group->world_size() > 1)) {
    log_("[deepspeed.cpp] activation_checkpointing.partition_activations: no activation_partition_group (the ranks "
         "are data parallel, each with activations of its own), so checkpointed inputs are kept whole");
  }
  if (offload_) {
    log_(std::string("[deepspeed.cpp] offload_optimizer ") +
         (nvme ? "nvme: fp32 master and optimizer state swapped to " + config_.zero.offload_optimizer.nvme_path + ", "
               : "cpu: fp32 master and optimizer state in host memory, ") +
         optimizer_->name() + " on the CPU (" + to_string(best_simd_path()) + "), " +
         std::to_string(offload_->store().sub_groups()) + " sub-group(s) of up to " +
         std::to_string(offload_->store().largest_sub_group()) + " elements");
  }
}

Engine::~Engine() {
  if (comms_logger_) {
    try {
      log_(comms_logger_->summary());
    } catch (...) {  // a destructor must not throw; the summary is a courtesy
    }
  }
}

bool Engine::is_gradient_accumulation_boundary() const {
  if (boundary_override_) return *boundary_override_;
  return (progress_.micro_steps + 1) % config_.batch.grad_accum == 0;
}

void Engine::set_param_groups(const std::vector<OptimizerParamGroup>& groups) {
  const auto& slots = stage_->layout().slots();
  std::map<std::string, int> slot_of;
  for (int i = 0; i < static_cast<int>(slots.size()); ++i) slot_of.emplace(slots[i].name, i);
  std::map<int, int> group_of_slot;
  std::vector<GroupSettings> settings;
  std::string unscheduled;  // groups whose own lr a config scheduler overrides
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& group = groups[g];
    const std::string where = "InitOptions::param_groups[" + std::to_string(g) + "]";
    if (group.weight_decay && !(*group.weight_decay >= 0)) {
      throw std::invalid_argument(where + ".weight_decay must be >= 0, got " + std::to_string(*group.weight_decay));
    }
    if (group.lr && !(*group.lr >= 0)) {
      throw std::invalid_argument(where + ".lr must be >= 0, got " + std::to_string(*group.lr));
    }
    for (const auto& name : group.params) {
      const auto it = slot_of.find(name);
      if (it == slot_of.end()) {
        throw std::invalid_argument(where + " names '" + name + "', which is not a trainable parameter of this model");
      }
      if (!group_of_slot.emplace(it->second, static_cast<int>(g)).second) {
        throw std::invalid_argument(where + " names '" + name + "', which group " +
                                    std::to_string(group_of_slot[it->second]) + " holds already");
      }
    }
    GroupSettings s{group.weight_decay, group.lr};
    if (s.lr && config_.scheduler) {
      unscheduled += (unscheduled.empty() ? "" : ", ") + std::to_string(g);
      s.lr.reset();
    }
    settings.push_back(s);
  }
  if (!unscheduled.empty()) {
    log_("[deepspeed.cpp] the config's scheduler (" + config_.scheduler->type + ") sets every group's lr, as "
         "DeepSpeed's does: the lr of parameter groups " + unscheduled + " is not used");
  }
  std::vector<GroupRange> ranges;
  const int rank = comm_->rank();
  for (const auto& fragment : stage_->master_fragments(rank)) {
    const auto it = group_of_slot.find(fragment.slot);
    if (it == group_of_slot.end()) continue;
    ranges.push_back({stage_->master_offset(fragment, rank), fragment.numel, it->second});
  }
  std::sort(ranges.begin(), ranges.end(), [](const GroupRange& a, const GroupRange& b) { return a.begin < b.begin; });
  optimizer_->set_groups(std::move(settings), std::move(ranges));
  log_("[deepspeed.cpp] " + std::to_string(group_of_slot.size()) + " parameters in " + std::to_string(groups.size()) +
       " groups of their own (" + std::to_string(optimizer_->group_ranges().size()) + " ranges of rank " +
       std::to_string(rank) + "'s partition)");
}

// After s applied steps the schedule stands at iteration s - 1 (-1: as built), as DeepSpeed's after s scheduler steps.
double Engine::lr() const { return schedule_->lr_at(progress_.schedule_steps - 1); }

void Engine::set_lr(double lr) {
  if (config_.scheduler) {
    throw std::logic_error("set_lr: the config's \"scheduler\" (" + config_.scheduler->type + ") drives the lr; "
                           "remove it to run a schedule of your own");
  }
  if (!(lr >= 0)) throw std::invalid_argument("set_lr: lr must be a number >= 0, got " + std::to_string(lr));
  schedule_ = std::make_unique<ConstantLR>(lr);
}

void Engine::set_group_lr(size_t group, double lr) {
  if (config_.scheduler) {
    throw std::logic_error("set_group_lr: the config's \"scheduler\" (" + config_.scheduler->type + ") drives every "
                           "group's lr; remove it to run a schedule of your own");
  }
  optimizer_->set_group_lr(static_cast<int>(group), lr);  // checks the group and the lr
}

std::vector<double> Engine::group_lrs() const {
  std::vector<double> out;
  for (const auto& group : optimizer_->groups()) out.push_back(group.lr.value_or(lr()));
  return out;
}

torch::Tensor Engine::forward(const std::function<torch::Tensor()>& loss_fn) {
  begin_forward();
  auto loss = loss_fn();
  end_forward(loss.defined() && loss.requires_grad());
  return loss;
}

void Engine::begin_forward() {
  fault::kill_point("engine.forward");
  forward_start_ns_ = now_ns();
  if (device_memory_) {
    forward_start_bytes_ = device_memory_->allocated();
    device_memory_->reset_peak();
  } else if (CpuMemoryTracker::installed()) {
    forward_start_bytes_ = CpuMemoryTracker::allocated();
    CpuMemoryTracker::reset_peak();
  }
  stage_->before_forward();
  checkpointing_->begin_forward();
  const auto& flops = config_.flops_profiler;
  if (flops.enabled && progress_.global_steps + 1 == flops.profile_step) {
    flops_counter_ = std::make_unique<FlopsCounter>();
  }
}

void Engine::end_forward(bool will_backward) {
  if (flops_counter_) {
    flops_profile_.forward_flops += flops_counter_->total();
    for (const auto& [name, n] : flops_counter_->by_module()) flops_profile_.by_module[name] += n;
    for (const auto& [op, n] : flops_counter_->by_op()) flops_profile_.by_op[op] += n;
    ++flops_profile_.micro_steps;
    flops_counter_.reset();
  }
  stage_->after_forward(will_backward);
  add_time(Phase::kForward, forward_start_ns_);
}

torch::Tensor Engine::run_unit(const torch::nn::Module& unit, const std::function<torch::Tensor()>& unit_forward) {
  auto it = module_unit_.find(&unit);
  return run_unit(it == module_unit_.end() ? -1 : it->second, unit_forward);  // -1: ZeRO-3 says it is no unit
}

torch::Tensor Engine::run_unit(int unit, const std::function<torch::Tensor()>& unit_forward) {
  if (!flops_counter_) return stage_->run_unit(unit, unit_forward);
  const bool named = unit >= 0 && unit < static_cast<int>(unit_names_.size());
  FlopsCounter::Scope scope(named ? unit_names_[unit] : std::string("(unit)"));
  return stage_->run_unit(unit, unit_forward);
}

void Engine::profile_flops(const StepReport& report) {
  const auto& config = config_.flops_profiler;
  flops_profile_.step = report.step;
  flops_profile_.recompute_fwd_factor = config.recompute_fwd_factor;
  flops_profile_.step_s = report.times[Phase::kForward] + report.times[Phase::kBackward] + report.times[Phase::kStep];
  flops_profile_.peak_flops = measure_peak_flops(dtype_, loss_sum_.device());
  const auto text = "[deepspeed.cpp] " + describe(flops_profile_, config.top_modules, config.module_depth, config.detailed);
  if (config.output_file.empty()) {
    log_(text);
  } else if (rank() == 0) {
    std::ofstream out(config.output_file, std::ios::app);
    out << text << '\n';
    if (!out) log_("[deepspeed.cpp] flops_profiler.output_file " + config.output_file + ": cannot write; " + text);
  }
}

void Engine::add_time(Phase phase, int64_t start_ns) {
  if (config_.wall_clock_breakdown && loss_sum_.is_cuda()) torch::cuda::synchronize(loss_sum_.device().index());
  step_times_[phase] += (now_ns() - start_ns) * 1e-9;
}

void Engine::backward(const torch::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1) {
    throw std::invalid_argument("Engine::backward: loss must be a scalar tensor, got " +
                                (loss.defined() ? std::to_string(loss.numel()) + " elements" : std::string("undefined")));
  }
  run_backward([&] {
    loss_sum_ += loss.detach().to(torch::kFloat32).reshape({});
    // fp32 scaling: a 16-bit loss times 2^16 would itself overflow.
    const double factor = scaler_->scale() / static_cast<double>(config_.batch.grad_accum);
    (loss.to(torch::kFloat32) * factor).backward();
  });
}

void Engine::backward_from(const std::vector<torch::Tensor>& outputs, const std::vector<torch::Tensor>& grads) {
  if (outputs.size() != grads.size()) {
    throw std::invalid_argument("Engine::backward_from: " + std::to_string(outputs.size()) + " outputs but " +
                                std::to_string(grads.size()) + " gradients");
  }
  run_backward([&] { torch::autograd::backward(outputs, grads); });
}

void Engine::run_backward(const std::function<void()>& autograd) {
  fault::kill_point("engine.backward");
  const int64_t start = now_ns();
  stage_->before_backward();
  autograd();
  add_time(Phase::kBackwardInner, start);
  const int64_t reduce_start = now_ns();
  stage_->after_backward();  // waits for the reductions backward launched (stages 2, 3)
  add_time(Phase::kBackwardAllreduce, reduce_start);
  add_time(Phase::kBackward, start);
  ++step_times_.micro_steps;
  if (device_memory_) {
    activations_peak_ = std::max(activations_peak_, device_memory_->peak() - forward_start_bytes_);
  } else if (CpuMemoryTracker::installed() && device_.is_cpu()) {
    activations_peak_ = std::max(activations_peak_, CpuMemoryTracker::peak() - forward_start_bytes_);
  }
}

bool Engine::step() {
  const bool boundary = is_gradient_accumulation_boundary();
  ++progress_.micro_steps;
  if (!boundary) return false;
  fault::kill_point("engine.step");
  StepReport report;
  update(report);
  step_times_.steps = 1;
  report.times = step_times_;
  print_window_.add(step_times_);
  step_times_ = PhaseTimes{};
  last_step_ = report;
  if (config_.flops_profiler.enabled && report.step == config_.flops_profiler.profile_step) profile_flops(report);
  log_step(report);
  write_monitors(report);
  return !report.skipped;
}

void Engine::update(StepReport& report) {
  // The schedule's iteration this step runs at: one behind the steps applied (skipped ones not counted), as
  // DeepSpeed's scheduler, stepped after each applied optimizer step, stands.
  const int64_t iteration = progress_.schedule_steps - 1;
  const double step_lr = schedule_->lr_at(iteration);
  report.lr = step_lr;  // what a skipped step leaves for the next; an applied one moves it on below
  report.loss_scale = scaler_->scale();
  ++progress_.global_steps;
  progress_.global_samples += config_.batch.train_batch_size;
  report.step = progress_.global_steps;

  // The boundary's reduction is backward's (DeepSpeed's backward_allreduce); the rest of this is the step.
  const int64_t reduce_start = now_ns();
  stage_->reduce_gradients();
  add_time(Phase::kBackwardAllreduce, reduce_start);
  add_time(Phase::kBackward, reduce_start);
  const int64_t step_start = now_ns();
  auto& grads = stage_->master_grads();

  // One collective for both numbers: this rank's share of ‖g‖² and its loss sum. inf/nan anywhere makes the
  // global norm non-finite on every rank, so all ranks agree on the overflow.
  const auto local_sq = counted_in_norm_.empty() ? stage_->local_grad_sq_norm()
                                                 : stage_->local_grad_sq_norm_of(counted_in_norm_, comm_->rank());
  auto packed = torch::stack({local_sq.to(loss_sum_.device()), loss_sum_.to(torch::kFloat64)});
  comm_->all_reduce(packed, ReduceOp::kSum).wait();
  if (model_group_) {  // the slices' shares of ‖g‖² (the loss is the same on every model-parallel rank)
    auto sq = packed.narrow(0, 0, 1);
    model_group_->all_reduce(sq, ReduceOp::kSum).wait();
  }
  // The stages' shares of ‖g‖², and the loss, which only the last stage has.
  if (pipe_group_) pipe_group_->all_reduce(packed, ReduceOp::kSum).wait();
  const auto host = packed.to(torch::kCPU);  // one device sync for both numbers
  const double scaled_norm = std::sqrt(host.data_ptr<double>()[0]);
  report.loss = host.data_ptr<double>()[1] / (config_.batch.grad_accum * comm_->world_size());
  loss_sum_.zero_();

  const bool overflow = !std::isfinite(scaled_norm);
  report.grad_norm = scaled_norm / report.loss_scale;
  if (scaler_->update(overflow, report.step)) {
    report.skipped = true;
    ++progress_.skipped_steps;
    stage_->zero_grads();
    add_time(Phase::kStep, step_start);
    return;
  }

  // Unscale and clip in one pass.
  double coef = 1.0 / report.loss_scale;
  const double clip = config_.gradient_clipping;
  if (clip > 0 && report.grad_norm > clip) coef *= clip / (report.grad_norm + 1e-6);
  if (coef != 1.0) grads.mul_(coef);

  if (auto betas = schedule_->betas_at(iteration)) optimizer_->set_betas(betas->beta1, betas->beta2);
  if (offload_) {
    offload_->step(grads, step_lr);  // on the host, each sub-group published as soon as it is updated
  } else {
    optimizer_->step(stage_->master_params(), grads, step_lr);
    stage_->publish_params();
  }
  ++progress_.schedule_steps;
  report.lr = lr();  // as DeepSpeed's get_lr() after the step: the lr the next step will use
  stage_->zero_grads();
  add_time(Phase::kStep, step_start);
}

void Engine::write_monitors(const StepReport& report) {
  if (monitors_.empty()) return;
  std::vector<MonitorEvent> events = {{"Train/Samples/train_loss", report.loss, progress_.global_samples},
                                      {"Train/Samples/lr", report.lr, progress_.global_samples}};
  if (config_.fp16.enabled) events.push_back({"Train/Samples/loss_scale", report.loss_scale, progress_.global_samples});
  if (config_.wall_clock_breakdown) {
    const char* names[kPhases] = {"forward", "backward", "backward_inner", "backward_allreduce", "step"};
    for (size_t i = 0; i < kPhases; ++i) {
      events.push_back({std::string("Train/Samples/elapsed_time_ms_") + names[i], report.times.seconds[i] * 1e3,
                        progress_.global_samples});
    }
  }
  for (auto& monitor : monitors_) monitor->write_events(events);
}

void Engine::log_step(const StepReport& report) {
  if (report.step % config_.steps_per_print != 0) return;
  const int64_t now = now_ns();
  const double seconds = (now - last_log_time_ns_) * 1e-9;
  last_log_time_ns_ = now;
  const double samples_per_s = seconds > 0 ? config_.batch.train_batch_size * config_.steps_per_print / seconds : 0.0;
  log_(format_step_line(report.step, report.loss, report.lr, report.loss_scale, report.grad_norm, samples_per_s,
                        progress_.skipped_steps));
  if (config_.wall_clock_breakdown) log_("[deepspeed.cpp] " + format_wall_clock(print_window_));
  print_window_ = PhaseTimes{};
  if (config_.memory_breakdown) {
    // Every rank's numbers in one exchange; rank 0 prints them all.
    const auto all = memory_breakdown_all_ranks();
    for (int r = 0; r < static_cast<int>(all.size()); ++r) log_("[deepspeed.cpp] " + describe(all[r], r));
  }
  if (config_.activation_checkpointing.profile) {
    log_("[deepspeed.cpp] " + describe(checkpointing_->stats(), /*with_times=*/true));
  }
}

bool Engine::save_16bit_model(const std::string& path) {
  check_not_model_parallel("save_16bit_model");
  if (stage_->stage() == 3 && !config_.zero.stage3_gather_16bit_weights_on_model_save) {
    log_("[deepspeed.cpp] save_16bit_model(" + path + ") did not save: under ZeRO-3 it needs "
         "zero_optimization.stage3_gather_16bit_weights_on_model_save: true");
    return false;
  }
  // Rank 0 opens the file first and every rank learns whether it could, so a bad path fails on all ranks at once
  // instead of leaving the others in a gather.
  std::unique_ptr<SafetensorsWriter> writer;
  std::string error;
  if (rank() == 0) {
    // The same parameters, names and order the stage visits; their sizes stay valid while ZeRO-3 holds no storage.
    std::vector<TensorInfo> infos;
    for (const auto& p : params_) infos.push_back({p.name, dtype_, p.shape});
    try {
      writer = std::make_unique<SafetensorsWriter>(path, infos, std::map<std::string, std::string>{{"format", "pt"}});
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (comm_->side_all_gather({error.empty() ? 0 : 1})[0] != 0) {
    throw std::runtime_error("save_16bit_model: rank 0 could not create the file: " +
                             (error.empty() ? path : error));
  }
  stage_->visit_params([&](const std::string& name, const torch::Tensor& value) {
    if (writer) writer->write(name, value);
  });
  if (writer) writer->close();
  return true;
}

ModelStateMemory Engine::memory() const {
  ModelStateMemory m;
  m.stage = stage_->memory();
  m.optimizer_state = optimizer_state_bytes_;
  return m;
}

MemoryBreakdown Engine::memory_breakdown() const {
  MemoryBreakdown b;
  b.states = memory();
  b.activations_peak = activations_peak_;
  const auto& s = b.states.stage;
  if (config_.zero.offload_optimizer.device == OffloadDevice::kCpu) b.offloaded_host += s.master + b.states.optimizer_state;
  if (config_.zero.offload_param.device == OffloadDevice::kCpu) b.offloaded_host += s.params16 - s.persistent;
  b.nvme = stage_->timers().param_swap.file_bytes + optimizer_swap().file_bytes;
  b.rss = resident_bytes();
  if (device_memory_) {
    b.live_tensors = device_memory_->allocated();
  } else if (CpuMemoryTracker::installed()) {
    b.live_tensors = CpuMemoryTracker::allocated();
  }
  return b;
}

std::vector<MemoryBreakdown> Engine::memory_breakdown_all_ranks() const {
  const auto all = comm_->side_all_gather(memory_breakdown().pack());
  std::vector<MemoryBreakdown> out;
  for (int r = 0; r < comm_->world_size(); ++r) {
    out.push_back(MemoryBreakdown::unpack(&all[r * MemoryBreakdown::kPacked]));
  }
  return out;
}

std::unique_ptr<Engine> initialize(std::shared_ptr<torch::nn::Module> model, const Config& config, InitOptions options) {
  return std::make_unique<Engine>(std::move(model), config, std::move(options));
}

std::unique_ptr<Engine> initialize(ModelTensors model, const Config& config, InitOptions options) {
  return std::make_unique<Engine>(std::move(model), config, std::move(options));
}

}  // namespace dscpp
