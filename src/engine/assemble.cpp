// assemble: config and options → the engine's parts (assemble.h gives the order). Every switch on a config value
// that selects behaviour lives here.
#include "dscpp/engine/assemble.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <iostream>
#include <set>
#include <unordered_set>

#include "dscpp/config/support.h"
#include "dscpp/engine/device.h"
#include "dscpp/engine/host_malloc.h"
#include "dscpp/engine/memory_report.h"
#include "dscpp/moe/moe_layer.h"
#include "dscpp/offload/nvme_store.h"
#include "dscpp/onebit/onebit_optimizer.h"
#include "dscpp/optim/cpu_adam.h"

namespace dscpp {
namespace {

// `group_size`: the data-parallel group's, which with sequence parallelism holds every sequence rank too.
void check_batch(const Config& config, int group_size) {
  const int sequence = config.sequence_parallel_size;
  if (group_size % sequence != 0) {
    throw ConfigError("sequence_parallel_size " + std::to_string(sequence) + " does not divide the data-parallel " +
                      "group's " + std::to_string(group_size) + " ranks (the sequence ranks are consecutive ranks " +
                      "of it)");
  }
  const int world_size = group_size / sequence;
  const auto& b = config.batch;
  if (b.train_batch_size != b.micro_batch * b.grad_accum * world_size) {
    throw ConfigError("train_batch_size " + std::to_string(b.train_batch_size) + " != micro " +
                      std::to_string(b.micro_batch) + " × grad_accum " + std::to_string(b.grad_accum) +
                      " × world_size " + std::to_string(world_size) +
                      ": the config was resolved for another world size");
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
// that read its weights) is whole parameters like any other; one holding a parameter the optimizer leaves alone
// though it wants a gradient (untrained_params) is gathered whole, as those are whole on every rank; the rest get
// their shapes back (views of their released buffers) for Stage 3 to adopt or regroup (frozen ones included).
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
  std::unordered_set<const c10::TensorImpl*> whole;
  for (const auto& p : model.params) {
    if (p.tensor.requires_grad() && untrained.count(p.name)) whole.insert(p.tensor.unsafeGetTensorImpl());
  }
  std::vector<PrepartitionedUnit> out;
  for (auto& unit : units) {
    if (unit.params.empty() || unit.whole) continue;
    if (unit.buffer.scalar_type() != dtype) {
      throw ConfigError("the model was built partitioned (zero.Init) in " +
                        std::string(c10::toString(unit.buffer.scalar_type())) + " but this config computes in " +
                        to_string(config.compute_dtype()) + ": build it with the config given to initialize");
    }
    const bool has_whole = std::any_of(unit.params.begin(), unit.params.end(), [&](const torch::Tensor& p) {
      return whole.count(p.unsafeGetTensorImpl()) > 0;
    });
    if (has_whole) {
      gather_whole(unit, *comm);
      continue;
    }
    point_into_buffer(unit);
    out.push_back(std::move(unit));
  }
  return out;
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

// The model's tensors sorted into what the optimizer trains and what it keeps as it is.
struct SplitModel {
  std::vector<torch::Tensor> params;  // trainable: what ZeRO partitions and the optimizer updates
  std::vector<std::string> names;
  std::vector<torch::Tensor> frozen;  // ZeRO-3: frozen parameters it partitions too (PartitionedModel::frozen)
  std::vector<std::string> frozen_names;
  std::vector<torch::Tensor> rest;    // the other frozen parameters and buffers, whole on every rank
};

// `partition_frozen` (ZeRO-3): frozen floating parameters (requires_grad false) go to the stage; a parameter that
// wants a gradient the optimizer does not use (untrained_params) stays whole, as at every other stage. `train` false
// (InitOptions::forward_only at ZeRO-3): every parameter is taken as frozen, whatever it asks for.
SplitModel split_model(const ModelTensors& model, const std::set<std::string>& untrained, bool partition_frozen,
                       bool train, EngineModel& held) {
  SplitModel split;
  for (const auto& p : model.params) {
    const bool frozen = !p.tensor.requires_grad() || !train;
    if (!frozen && !untrained.count(p.name)) {
      split.params.push_back(p.tensor);
      split.names.push_back(p.name);
      held.params.push_back({p.name, p.tensor.sizes().vec()});
      continue;
    }
    if (partition_frozen && frozen && p.tensor.is_floating_point()) {
      split.frozen.push_back(p.tensor);
      split.frozen_names.push_back(p.name);
    } else {
      split.rest.push_back(p.tensor);
    }
    held.module_state.push_back({p.name, p.tensor, /*frozen=*/true, p.tensor.sizes().vec()});
  }
  std::set<std::string> non_persistent = model.non_persistent_buffers;
  for (const auto& b : model.buffers) {
    split.rest.push_back(b.tensor);
    if (non_persistent.erase(b.name) == 0) {
      held.module_state.push_back({b.name, b.tensor, /*frozen=*/false, b.tensor.sizes().vec()});
    }
  }
  if (!non_persistent.empty()) {
    throw std::invalid_argument("dscpp::initialize: ModelTensors::non_persistent_buffers names '" +
                                *non_persistent.begin() + "', which is not one of the model's buffers");
  }
  for (const auto& unit : model.units) held.unit_names.push_back(unit.name);
  return split;
}

std::vector<torch::Tensor> parameter_tensors(const ModelTensors& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.params) out.push_back(p.tensor);
  return out;
}

// Where training runs: the parameters' device. As DeepSpeed does, a rank training on a GPU makes the GPU its
// LOCAL_RANK names current (so streams, the caching allocator and NCCL use it); a model on another GPU is an error,
// not a run whose every collective crosses devices. A CPU run never touches CUDA. `joined`: the program gave the
// group (and so chose the device) itself.
torch::Device training_device(const std::vector<torch::Tensor>& params, bool joined) {
  const torch::Device device = params.empty() ? torch::Device(torch::kCPU) : params.front().device();
  if (device.is_cuda() && joined) {
    make_current(device);
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
  return device;
}

// fp16 → static or dynamic scaler; fp32/bf16 → the unit scaler that stops on non-finite gradients.
std::unique_ptr<LossScaler> make_loss_scaler(const Config& config, std::function<void(const std::string&)> log) {
  if (!config.fp16.enabled) return make_unit_scaler();
  const auto& options = config.fp16.scaler;
  if (options.static_scale > 0) return make_static_scaler(options.static_scale, std::move(log));
  return make_dynamic_scaler(options, std::move(log));
}

// offload_param nvme (stage 3): the 16-bit partition in rank `rank`'s swap file under the section's nvme_path (empty
// for any other device).
StateStoreFactory param_store(const Config& config, int rank) {
  const auto& param = config.zero.offload_param;
  if (param.device != OffloadDevice::kNvme) return nullptr;
  NvmeStoreOptions o;
  o.nvme_path = param.nvme_path;
  o.config_key = "zero_optimization.offload_param.nvme_path";
  o.role = "param";
  o.rank = rank;
  o.buffer_count = param.buffer_count;
  o.pin_memory = param.pin_memory;
  o.aio = config.aio;
  o.read_ahead = false;  // ZeRO-3 says which shards come next (StateStore::prefetch)
  return [o](const std::vector<int64_t>& shard_sizes, const torch::Tensor& initial) mutable {
    o.sub_group_sizes = shard_sizes;
    o.dtype = initial.scalar_type();
    std::vector<int64_t> begins{0};
    for (int64_t n : shard_sizes) begins.push_back(begins.back() + n);
    o.initial_values = [&](int i, const std::vector<torch::Tensor>& slices) {
      slices[0].copy_(initial.narrow(0, begins[static_cast<size_t>(i)], slices[0].numel()));
    };
    return make_nvme_store(o);
  };
}

// The stage's view of the config: its group, buckets, offload and DeepSpeed's gradient averaging (with
// prescale_gradients the gradients are divided by the data-parallel size before the sum over ranks; otherwise by
// gradient_predivide_factor f before and multiplied by f / that size after). The sum runs over the whole group; with
// sequence parallelism the size averaged over is the group's / sequence_parallel_size, as DeepSpeed divides: each
// rank's loss is its share of its sequence's, so the sequence ranks' gradients add up to the sequence's.
StageContext stage_context(const Config& config, std::shared_ptr<Comm> comm) {
  StageContext context;
  const int rank = comm->rank(), group = comm->world_size(), world = group / config.sequence_parallel_size;
  context.comm = std::move(comm);
  if (config.communication_data_type) context.comm_dtype = to_scalar_type(*config.communication_data_type);
  if (config.sequence_parallel_size > 1) {
    context.comm_dtype = to_scalar_type(config.seq_parallel_communication_data_type);
  }
  context.overlap_comm = config.zero.overlap_comm;
  context.reduce_scatter = config.zero.reduce_scatter;
  context.allgather_bucket_numel = config.zero.allgather_bucket_size;
  context.quantized_weights = config.zero.quantized_weights;
  context.quantized_nontrainable_weights = config.zero.quantized_nontrainable_weights;
  if (const int64_t hpz = config.zero.hpz_partition_size; hpz > 1) {
    if (group % hpz != 0) {
      throw std::invalid_argument("zero_optimization.zero_hpz_partition_size = " + std::to_string(hpz) +
                                  ": must divide the data-parallel size, " + std::to_string(group));
    }
    // Consecutive ranks, as a node's GPUs are numbered. Collective: every rank of the data group splits.
    context.hpz_comm = context.comm->split(static_cast<int>(rank / hpz), rank);
    context.hpz_across = context.comm->split(static_cast<int>(rank % hpz), rank);
  }
  context.quantized_gradients = config.zero.quantized_gradients;
  // The optimizer's store is OptimizerOffload's (make_optimizer_store), made once the stage has its master.
  context.optimizer_offload = {config.zero.offload_optimizer.device, config.zero.offload_optimizer.pin_memory};
  context.param_offload = {config.zero.offload_param.device, config.zero.offload_param.pin_memory};
  context.param_store = param_store(config, rank);
  if (config.prescale_gradients) {
    context.grad_pre_divide = world;
    context.grad_post_scale = 1.0;
  } else {
    context.grad_pre_divide = config.gradient_predivide_factor;
    context.grad_post_scale = config.gradient_predivide_factor / world;
  }
  return context;
}

// The ZeRO stage over the trainable parameters: stage 3 partitions them group by group (no whole-model buffer on any
// rank); stages 0-2 over one flat buffer (`flat`, filled here), which every rank starts from rank 0's values of.
std::unique_ptr<ZeroStage> make_stage(const Config& config, StageContext context, const ParallelLayout& layout,
                                      SplitModel& split, ModelTensors& model,
                                      std::vector<PrepartitionedUnit> prepartitioned, torch::ScalarType dtype,
                                      torch::Device device, bool forward_only, std::unique_ptr<FlatParams>& flat) {
  if (config.zero.stage == 3) {
    PartitionedModel partitioned{split.params,        split.names,  std::move(model.units), std::move(prepartitioned),
                                 split.frozen, split.frozen_names};
    return make_stage3(context, std::move(partitioned), config.zero);
  }
  // Communication groups are reduce_bucket_size elements: each is reduced (and, sharded, all-gathered) as one.
  const int ep = layout.expert_parallel();
  if (split.params.empty() && !forward_only) {
    throw std::invalid_argument("dscpp::initialize: the model has no trainable parameters (every one has "
                                "requires_grad false); to run it forward only, initialize without an optimizer");
  }
  flat = std::make_unique<FlatParams>(split.params, split.names, layout.data().world_size(), dtype, device,
                                      config.zero.reduce_bucket_size, layout.expert_flags(split.names), ep);
  context.expert_comm = layout.expert_data_group();
  // Experts differ between expert-parallel ranks: each comes from the first rank that holds it.
  if (ep == 1) {
    layout.data().broadcast(flat->params(), 0).wait();
  } else {
    for (const auto& g : flat->layout().groups()) {
      auto values = flat->params().narrow(0, g.offset, g.numel);
      context.comm_for(g).broadcast(values, 0).wait();
    }
  }
  context.flat = flat.get();
  switch (config.zero.stage) {
    case 0: return make_stage0(context);
    case 1: return make_stage1(context);
    case 2: return make_stage2(context);
  }
  throw ConfigError("zero_optimization.stage: stage " + std::to_string(config.zero.stage) +
                    " is not supported yet by deepspeed.cpp");
}

// Where offload_optimizer keeps `stage`'s master and `optimizer`'s state: in host memory ("cpu": the stage's master
// and the optimizer's own tensors), or in rank `rank`'s swap file under nvme_path ("nvme": seeded from the stage's
// master and fresh state, after which the stage's copy is released; `optimizer` was built for 0 elements).
std::unique_ptr<StateStore> make_optimizer_store(const Config& config, ZeroStage& stage, FlatOptimizer& optimizer,
                                                 int rank) {
  const auto& offload = config.zero.offload_optimizer;
  torch::Tensor master = stage.master_params();
  if (offload.device == OffloadDevice::kCpu) {
    std::vector<torch::Tensor> state;
    for (auto& [kind, tensor] : optimizer.state_tensors()) state.push_back(tensor);
    return make_resident_store(master, std::move(state), config.zero.sub_group_size);
  }
  NvmeStoreOptions o;
  o.nvme_path = offload.nvme_path;
  o.config_key = "zero_optimization.offload_optimizer.nvme_path";
  o.rank = rank;
  o.sub_group_sizes = uniform_sub_groups(master.numel(), config.zero.sub_group_size);
  o.kinds = 1 + static_cast<int>(optimizer.state_kinds().size());
  o.buffer_count = offload.buffer_count;
  o.pin_memory = offload.pin_memory;
  o.aio = config.aio;
  o.initial_values = [&](int i, const std::vector<torch::Tensor>& slices) {
    slices[0].copy_(master.narrow(0, i * config.zero.sub_group_size, slices[0].numel()));
    optimizer.init_state({slices.begin() + 1, slices.end()});
  };
  auto store = make_nvme_store(o);
  stage.release_master();
  return store;
}

// InitOptions::param_groups as ranges of this rank's master partition for the optimizer.
void set_param_groups(const std::vector<OptimizerParamGroup>& groups, const Config& config, ZeroStage& stage,
                      FlatOptimizer& optimizer, int rank, const std::function<void(const std::string&)>& log) {
  const auto& slots = stage.layout().slots();
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
    if (s.lr && config.scheduler) {
      unscheduled += (unscheduled.empty() ? "" : ", ") + std::to_string(g);
      s.lr.reset();
    }
    settings.push_back(s);
  }
  if (!unscheduled.empty()) {
    log("[deepspeed.cpp] the config's scheduler (" + config.scheduler->type + ") sets every group's lr, as "
        "DeepSpeed's does: the lr of parameter groups " + unscheduled + " is not used");
  }
  std::vector<GroupRange> ranges;
  for (const auto& fragment : stage.master_fragments(rank)) {
    const auto it = group_of_slot.find(fragment.slot);
    if (it == group_of_slot.end()) continue;
    ranges.push_back({stage.master_offset(fragment, rank), fragment.numel, it->second});
  }
  std::sort(ranges.begin(), ranges.end(), [](const GroupRange& a, const GroupRange& b) { return a.begin < b.begin; });
  optimizer.set_groups(std::move(settings), std::move(ranges));
  log("[deepspeed.cpp] " + std::to_string(group_of_slot.size()) + " parameters in " + std::to_string(groups.size()) +
      " groups of their own (" + std::to_string(optimizer.group_ranges().size()) + " ranges of rank " +
      std::to_string(rank) + "'s partition)");
}

// Where each model tensor's elements lie in this rank's master partition, for the optimizers that take each
// tensor's norms (Lamb, 1-bit LAMB); a ZeRO partition holds pieces, whose sums the data-parallel ranks add up.
void set_partition_tensors(const Config& config, ZeroStage& stage, FlatOptimizer& optimizer,
                           std::shared_ptr<Comm> data, int rank) {
  PartitionTensors tensors;
  tensors.tensor_count = static_cast<int>(stage.layout().slots().size());
  for (const auto& fragment : stage.master_fragments(rank)) {
    tensors.ranges.push_back({stage.master_offset(fragment, rank), fragment.numel, fragment.slot});
  }
  std::sort(tensors.ranges.begin(), tensors.ranges.end(),
            [](const TensorRange& a, const TensorRange& b) { return a.begin < b.begin; });
  if (config.zero.stage > 0 && data->world_size() > 1) {
    tensors.sum_over_ranks = [data](torch::Tensor& sums) { data->all_reduce(sums, ReduceOp::kSum).wait(); };
  }
  optimizer.set_partition_tensors(std::move(tensors));
}

// The lines a run starts with: the stage and its memory, and where offload puts what.
void log_assembly(const EngineParts& parts, const InitOptions& options) {
  const auto& config = parts.config;
  const auto& log = parts.observer->log_sink();
  const Comm& comm = parts.layout->data();
  int64_t optimizer_state = 0;
  for (auto& [name, tensor] : parts.optimizer->state_tensors()) optimizer_state += tensor.nbytes();
  log("[deepspeed.cpp] ZeRO stage " + std::to_string(parts.stage->stage()) + ", world size " +
      std::to_string(comm.world_size()) + " (" + comm.backend() + "), " + to_string(config.compute_dtype()) + ": " +
      describe(ModelStateMemory{parts.stage->memory(), optimizer_state}));
  if (const auto& param = config.zero.offload_param; param.device != OffloadDevice::kNone) {
    log(param.device == OffloadDevice::kCpu
            ? std::string("[deepspeed.cpp] offload_param cpu: the 16-bit parameter partition in host memory")
            : "[deepspeed.cpp] offload_param nvme: the 16-bit parameter partition swapped to " + param.nvme_path +
                  ", each group's shard read ahead of its gather");
  }
  const auto& partition = options.activation_partition_group;  // assemble_tensors defaulted it
  if (config.activation_checkpointing.partition_activations && !(partition && partition->world_size() > 1)) {
    log("[deepspeed.cpp] activation_checkpointing.partition_activations: no activation_partition_group (the ranks "
        "are data parallel, each with activations of its own), so checkpointed inputs are kept whole");
  }
  if (const OptimizerOffload* offload = parts.optimizer_step->offload()) {
    const bool nvme = config.zero.offload_optimizer.device == OffloadDevice::kNvme;
    log(std::string("[deepspeed.cpp] offload_optimizer ") +
        (nvme ? "nvme: fp32 master and optimizer state swapped to " + config.zero.offload_optimizer.nvme_path + ", "
              : "cpu: fp32 master and optimizer state in host memory, ") +
        parts.optimizer->name() + " on the CPU (" + to_string(best_simd_path()) + "), " +
        std::to_string(offload->store().sub_groups()) + " sub-group(s) of up to " +
        std::to_string(offload->store().largest_sub_group()) + " elements");
  }
}

// Every path ends here, with the model's tensors, the gather units taken and the layout's groups and names known.
EngineParts assemble_tensors(ModelTensors model, Config config, InitOptions options,
                             std::vector<PrepartitionedUnit> prepartitioned, EngineModel held,
                             ParallelLayout::Groups groups, ParallelLayout::Names names, int model_expert_parallel) {
  EngineParts parts;
  // Forward only (InitOptions::forward_only), every parameter is held as a frozen one, so none is left wanting a
  // gradient the optimizer does not use: ZeRO-3 partitions them, stages 0-2 keep them whole on every rank (rank 0's
  // values), and nothing for training is allocated (no fp32 master, gradient buffer or optimizer state). Sliced or
  // expert parameters keep the training layout, which knows where each sits (frozen ones are held as plain weights).
  if (config.compression.any_enabled() && !options.compression_applied) {
    throw ConfigError("compression_training: switched on, but this program does not apply it (DeepSpeed Compression "
                      "acts on the model's modules: from Python, dscpp.compression.init_compression before "
                      "dscpp.initialize; gpt-train --compression); remove the section or switch it off");
  }
  if (config.sparse_attention && !options.sparse_attention_applied) {
    throw ConfigError("sparse_attention: the section describes the model's attention, but this model does not "
                      "compute it (from Python, build the attention with dscpp.ops.sparse_attention."
                      "SparseSelfAttention; gpt-train --sparse_attention); remove the section");
  }
  const bool placed = !names.sliced.empty() || !names.slices.empty() || !names.experts.empty();
  if (options.forward_only && placed) options.forward_only = false;
  if (options.forward_only) options.untrained_params.clear();
  held.forward_only = options.forward_only;
  for (const auto& name : options.untrained_params) {
    const bool trainable = std::any_of(model.params.begin(), model.params.end(), [&](const NamedTensor& p) {
      return p.name == name && p.tensor.requires_grad();
    });
    if (!trainable) {
      throw std::invalid_argument("dscpp::initialize: InitOptions::untrained_params names '" + name +
                                  "', which is not a parameter that requires a gradient");
    }
  }
  prepartitioned = adopt_prepartitioned(std::move(prepartitioned), model, options.untrained_params, config,
                                        groups.data.get());
  tune_host_malloc();  // once per process: the host-side blocks every step reuses stay in the heap
  auto optimizer_config = config.optimizer ? config.optimizer : options.client_optimizer;
  // Forward only, nothing steps: a stateless SGD at lr 0 stands in where the program names no optimizer.
  if (!optimizer_config && options.forward_only) optimizer_config = OptimizerConfig{"SGD", SgdOptions{0.0}};
  if (!optimizer_config) {
    throw ConfigError("optimizer: the config has no \"optimizer\" section and the program passed none; add e.g. "
                      "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}");
  }
  if (!config.optimizer) {
    // The program's optimizer meets the config as the config's own would (ZeRO with a 1-bit one, Lamb offloaded).
    Config with_client = config;
    with_client.optimizer = optimizer_config;
    check_supported(with_client);
  }

  // The model: cast first, then flatten (the flat buffers are allocated in the compute dtype, the params views).
  held.dtype = to_scalar_type(config.compute_dtype());
  cast_floating(model, held.dtype);
  SplitModel split =
      split_model(model, options.untrained_params, config.zero.stage == 3, !options.forward_only, held);
  held.device = training_device(!split.params.empty()   ? split.params
                                : !split.frozen.empty() ? split.frozen
                                                        : parameter_tensors(model),
                                groups.data != nullptr);

  // The data-parallel group: the backend follows the data (NCCL for CUDA parameters, Gloo for CPU ones and ranks
  // sharing a GPU). The log speaks for the run's first rank.
  if (!groups.data) {
    const DistEnv env = DistEnv::from_env();
    groups.data = init_comm(env, comm_backend_for(held.device, env.local_size));
  }
  auto log = std::move(options.log);
  if (!log) {
    log = [rank = (groups.world ? groups.world : groups.data)->rank()](const std::string& line) {
      if (rank == 0) std::cerr << line << std::endl;
    };
  }
  check_batch(config, groups.data->world_size());
  parts.observer = std::make_unique<StepObserver>(config, groups.data->rank(), held.device, held.dtype, log);
  groups.data = parts.observer->observe(std::move(groups.data));
  parts.layout = std::make_unique<ParallelLayout>(std::move(groups), std::move(names), config, model_expert_parallel);
  const ParallelLayout& layout = *parts.layout;
  const int rank = layout.data().rank();

  parts.stage = make_stage(config, stage_context(config, layout.data_group()), layout, split, model,
                           std::move(prepartitioned), held.dtype, held.device, held.forward_only, parts.flat);
  broadcast_rest(split.rest, layout.data());

  // The optimizer's kernels: one fused pass over p, g, m and v instead of the torch arithmetic's eight passes over
  // memory (and, on a GPU, their launches): the SIMD CPU Adam for master weights on the host (offloaded or not),
  // torch's fused Adam for master weights on a GPU. Other optimizers, and AMSGrad, keep the torch arithmetic
  // (flat_adam.cpp). Offloaded to NVMe, the optimizer holds no state of its own: it runs over the store's slices.
  ZeroStage& stage = *parts.stage;
  const auto& offload = config.zero.offload_optimizer;
  const bool offloaded = offload.device != OffloadDevice::kNone;
  const auto kernels = offloaded || stage.master_params().device().is_cpu() ? OptimizerKernels::kCpuSimd
                                                                              : OptimizerKernels::kFused;
  const int64_t partition = offload.device == OffloadDevice::kNvme ? 0 : stage.master_params().numel();
  const bool onebit = is_onebit_optimizer(*optimizer_config);
  const bool per_tensor = std::holds_alternative<LambOptions>(optimizer_config->options) ||
                          std::holds_alternative<OneBitLambOptions>(optimizer_config->options);
  if ((onebit || per_tensor) && (layout.model_group() || layout.expert_parallel() > 1 || options.pipeline_group)) {
    // The 1-bit ones compress one buffer averaged over data-parallel ranks that hold the whole model; Lamb's
    // per-tensor norms are summed over the data-parallel group only.
    throw ConfigError("optimizer.type: \"" + optimizer_config->type + "\" with tensor, pipeline or expert "
                      "parallelism is not supported yet by deepspeed.cpp");
  }
  if (onebit) {
    parts.optimizer =
        make_onebit_optimizer(*optimizer_config, partition, stage.master_params().options(), layout.data_group());
  } else {
    parts.optimizer = make_flat_optimizer(*optimizer_config, partition, stage.master_params().options(), kernels);
  }
  if (per_tensor) set_partition_tensors(config, stage, *parts.optimizer, layout.data_group(), rank);
  if (!options.param_groups.empty()) set_param_groups(options.param_groups, config, stage, *parts.optimizer, rank, log);
  if (std::holds_alternative<ZeroOneAdamOptions>(optimizer_config->options)) {
    for (const auto& group : parts.optimizer->groups()) {
      if (group.lr) {
        // Its synchronisation divides by the sum of the lrs stepped since the last one: one sum for every parameter.
        throw ConfigError("optimizer.type: \"ZeroOneAdam\" with a parameter group of its own lr is not supported "
                          "yet by deepspeed.cpp (give every group the optimizer's lr)");
      }
    }
  }
  parts.optimizer_step =
      offloaded ? make_offloaded_step(std::make_unique<OptimizerOffload>(
                      *parts.optimizer, make_optimizer_store(config, stage, *parts.optimizer, rank), stage, held.dtype))
                : make_in_place_step(*parts.optimizer, stage);
  const double base_lr = optimizer_config->lr();
  parts.schedule =
      config.scheduler ? make_lr_schedule(*config.scheduler, base_lr) : std::make_unique<ConstantLR>(base_lr);
  parts.scaler = make_loss_scaler(config, log);
  parts.observer->track_memory();

  parts.layout->bind(stage.layout().slots(), log);
  if (!options.activation_partition_group) options.activation_partition_group = layout.model_group();
  parts.checkpointing = std::make_unique<ActivationCheckpointing>(config.activation_checkpointing,
                                                                  options.activation_partition_group);
  parts.observer->open_monitors(layout.data());
  parts.config = std::move(config);
  parts.model = std::move(held);
  log_assembly(parts, options);
  return parts;
}

// A LibTorch module's way in: its gather units, a model built partitioned, the experts its MoE layers name. The
// layout's groups and names are InitOptions' unless `given` (a composer's, which splits the model itself).
EngineParts assemble_module(std::shared_ptr<torch::nn::Module> module, Config config, InitOptions options,
                            std::optional<std::pair<ParallelLayout::Groups, ParallelLayout::Names>> given) {
  if (!module) throw std::invalid_argument("dscpp::initialize: model is null");
  check_supported(config);
  auto prepartitioned = take_partitioned(options);  // may give the comm
  EngineModel held;
  auto tensors = model_tensors(*module, options.gather_units);
  for (size_t u = 0; u < options.gather_units.size(); ++u) {
    held.unit_of.emplace(options.gather_units[u].get(), static_cast<int>(u));
  }
  options.gather_units.clear();
  options.partitioned.reset();
  auto [groups, names] = given ? std::move(*given)
                               : std::make_pair(ParallelLayout::Groups::of(options), ParallelLayout::Names::of(options));
  if (names.experts.empty()) {
    for (auto& name : moe::expert_parameter_names(*module)) names.experts.insert(std::move(name));
  }
  const int model_expert_parallel = moe::expert_parallel_size(*module);
  held.module = std::move(module);
  return assemble_tensors(std::move(tensors), std::move(config), std::move(options), std::move(prepartitioned),
                          std::move(held), std::move(groups), std::move(names), model_expert_parallel);
}

}  // namespace

EngineParts assemble(std::shared_ptr<torch::nn::Module> module, Config config, InitOptions options) {
  return assemble_module(std::move(module), std::move(config), std::move(options), std::nullopt);
}

EngineParts assemble(std::shared_ptr<torch::nn::Module> module, Config config, InitOptions options,
                     ParallelLayout::Groups groups, ParallelLayout::Names names) {
  const std::pair<const char*, bool> set[] = {{"comm", options.comm != nullptr},
                                             {"model_parallel_group", options.model_parallel_group != nullptr},
                                             {"pipeline_group", options.pipeline_group != nullptr},
                                             {"world_group", options.world_group != nullptr},
                                             {"partitioned", options.partitioned != nullptr}};
  for (const auto& [field, is_set] : set) {
    if (!is_set) continue;
    throw std::invalid_argument(std::string("InitOptions::") + field + " is set, but this engine's groups come from "
                                "the one that splits the model (a PipelineEngine's from its ParallelGroups): leave "
                                "it empty");
  }
  return assemble_module(std::move(module), std::move(config), std::move(options),
                         std::make_pair(std::move(groups), std::move(names)));
}

EngineParts assemble(ModelTensors model, Config config, InitOptions options) {
  if (!options.gather_units.empty() || options.partitioned) {
    throw std::invalid_argument("dscpp::initialize: InitOptions::gather_units and InitOptions::partitioned name "
                                "LibTorch modules; an engine built from ModelTensors takes ModelTensors::units");
  }
  check_supported(config);
  auto prepartitioned = std::move(model.prepartitioned);
  auto groups = ParallelLayout::Groups::of(options);
  auto names = ParallelLayout::Names::of(options);
  return assemble_tensors(std::move(model), std::move(config), std::move(options), std::move(prepartitioned),
                          EngineModel{}, std::move(groups), std::move(names), 1);
}

}  // namespace dscpp
