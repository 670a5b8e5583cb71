// ParallelLayout: the groups a model is split over and what the engine does differently for each.
#include "dscpp/engine/parallel_layout.h"

#include <algorithm>
#include <stdexcept>

namespace dscpp {
namespace {

// A group of one rank is the whole model along that axis: nothing to join.
std::shared_ptr<Comm> if_split(std::shared_ptr<Comm> group) {
  return group && group->world_size() > 1 ? std::move(group) : nullptr;
}

}  // namespace

ParallelLayout::Groups ParallelLayout::Groups::of(const InitOptions& options) {
  return {options.comm, options.model_parallel_group, options.pipeline_group, options.world_group,
          options.expert_data_parallel_group};
}

ParallelLayout::Names ParallelLayout::Names::of(const InitOptions& options) {
  Names names;
  names.sliced = options.model_parallel_params;
  for (const auto& [name, slice] : options.model_parallel_slices) names.sliced.insert(name);
  names.slices = options.model_parallel_slices;
  names.counted_elsewhere = options.norm_counted_elsewhere;
  names.experts = options.expert_params;
  return names;
}

ParallelLayout::ParallelLayout(Groups groups, Names names, const Config& config, int model_expert_parallel)
    : groups_(std::move(groups)), names_(std::move(names)) {
  if (!groups_.data) throw std::logic_error("ParallelLayout: the data-parallel group is required");
  if (const int tp = config.tensor_parallel_size; tp > 1) {
    const int given = groups_.model ? groups_.model->world_size() : 1;
    if (given != tp) {
      throw ConfigError("tensor_parallel.autotp_size: " + std::to_string(tp) + ", but the model-parallel group given "
                        "has " + std::to_string(given) + " rank(s). deepspeed.cpp slices no model by itself: build the "
                        "model tensor parallel (dscpp/parallel's layers) over a group of " + std::to_string(tp) +
                        " ranks and pass it as InitOptions::model_parallel_group, as gpt-train --tensor_parallel does");
    }
  }
  const auto& experts = groups_.expert_data;
  const int data = groups_.data->world_size();
  if (config.zero.stage == 3) {
    const int ep = experts ? data / std::max(1, experts->world_size()) : model_expert_parallel;
    if (ep > 1) {
      throw std::invalid_argument("ZeRO stage 3 with expert parallelism (ep_size " + std::to_string(ep) +
                                  ") is not supported: stage 3 gathers every parameter over the data-parallel group, "
                                  "whose ranks hold different experts; use ZeRO stage 0, 1 or 2");
    }
  }
  if (experts && (experts->world_size() < 1 || data % experts->world_size() != 0)) {
    throw std::invalid_argument("InitOptions::expert_data_parallel_group has " +
                                std::to_string(experts->world_size()) +
                                " ranks, which does not divide the data-parallel size " + std::to_string(data));
  }
  expert_parallel_ = experts ? data / experts->world_size() : 1;
  if (model_expert_parallel > 1 && model_expert_parallel != expert_parallel_) {
    throw std::invalid_argument("the model's MoE layers spread their experts over ep_size " +
                                std::to_string(model_expert_parallel) + " ranks but the engine was given " +
                                (experts ? "an expert-data-parallel group for ep_size " +
                                               std::to_string(expert_parallel_)
                                         : std::string("no expert-data-parallel group")) +
                                ": pass InitOptions::expert_data_parallel_group from moe::make_expert_groups(comm, " +
                                std::to_string(model_expert_parallel) + ")");
  }
  if (expert_parallel_ > 1 && names_.experts.empty()) {
    throw std::invalid_argument("InitOptions::expert_data_parallel_group is given (ep_size " +
                                std::to_string(expert_parallel_) + ") but no parameter is an expert: name them in "
                                "InitOptions::expert_params (moe::expert_parameter_names)");
  }
  // The config's tensor_parallel and pipeline keys are refused with it at parse time; groups handed over directly
  // (InitOptions, a pipeline's grid) are refused here.
  for (const auto& [group, what] : {std::pair{groups_.model, "tensor"}, std::pair{groups_.pipe, "pipeline"}}) {
    if (config.sequence_parallel_size > 1 && group && group->world_size() > 1) {
      throw ConfigError("sequence_parallel_size " + std::to_string(config.sequence_parallel_size) + " with a " +
                        what + "-parallel group of " + std::to_string(group->world_size()) + " ranks: sequence and " +
                        what + " parallelism together are not supported yet by deepspeed.cpp");
    }
  }
  if (config.sequence_parallel_size > 1 && (!names_.experts.empty() || model_expert_parallel > 1)) {
    throw ConfigError("sequence_parallel_size " + std::to_string(config.sequence_parallel_size) +
                      " with Mixture-of-Experts layers: not supported yet by deepspeed.cpp (their gates route each "
                      "rank's slice of the sequence alone)");
  }
  if (expert_parallel_ == 1) groups_.expert_data.reset();
  groups_.model = if_split(std::move(groups_.model));
  groups_.pipe = if_split(std::move(groups_.pipe));
}

std::vector<bool> ParallelLayout::expert_flags(const std::vector<std::string>& trainable) const {
  if (expert_parallel_ == 1) return {};
  std::set<std::string> unknown = names_.experts;
  std::vector<bool> flags;
  for (const auto& name : trainable) flags.push_back(unknown.erase(name) > 0);
  if (!unknown.empty()) {
    throw std::invalid_argument("InitOptions::expert_params names '" + *unknown.begin() +
                                "', which is not a trainable parameter of this model");
  }
  return flags;
}

void ParallelLayout::bind(const std::vector<ParamSlot>& slots, const std::function<void(const std::string&)>& log) {
  for (const auto& slot : slots) slot_names_.push_back(slot.name);
  const std::set<std::string> mine(slot_names_.begin(), slot_names_.end());
  if (names_.other_stages_named) {
    // The program names the whole model's parameters; this stage keeps its own layers'.
    const auto keep_mine = [&](auto& names) {
      for (auto it = names.begin(); it != names.end();) {
        const std::string& name = *it;
        it = mine.count(name) ? std::next(it) : names.erase(it);
      }
    };
    keep_mine(names_.sliced);
    keep_mine(names_.counted_elsewhere);
    for (auto it = names_.slices.begin(); it != names_.slices.end();) {
      it = mine.count(it->first) ? std::next(it) : names_.slices.erase(it);
    }
  }
  using NameSet = const std::set<std::string>*;
  for (const auto* names : std::initializer_list<NameSet>{&names_.sliced, &names_.counted_elsewhere}) {
    for (const auto& name : *names) {
      if (mine.count(name)) continue;
      throw std::invalid_argument(std::string("InitOptions::") +
                                  (names == &names_.sliced ? "model_parallel_params (or _slices)"
                                                           : "norm_counted_elsewhere") +
                                  " names '" + name + "', which is not a trainable parameter of this model");
    }
  }
  if (expert_parallel_ > 1) {
    int64_t experts = 0;
    for (const auto& name : slot_names_) experts += names_.experts.count(name);
    log("[deepspeed.cpp] expert parallel " + std::to_string(expert_parallel_) + ": " + std::to_string(experts) +
        " of " + std::to_string(slots.size()) + " trainable parameters are experts, averaged and partitioned over " +
        std::to_string(groups_.expert_data->world_size()) + " rank(s) holding the same experts");
  }
  if (!split()) return;
  const auto& model = groups_.model;
  for (const auto& slot : slots) {
    const auto it = names_.slices.find(slot.name);
    if (it == names_.slices.end()) {
      if (model && names_.sliced.count(slot.name) && unsliced_param_.empty()) unsliced_param_ = slot.name;
    } else if (it->second.shape() != slot.shape) {
      throw std::invalid_argument("InitOptions::model_parallel_slices: '" + slot.name + "' is a slice of shape " +
                                  c10::str(c10::IntArrayRef(it->second.shape())) + " of " +
                                  c10::str(c10::IntArrayRef(it->second.whole_shape)) + ", the parameter is " +
                                  c10::str(c10::IntArrayRef(slot.shape)));
    }
  }
  for (const auto& slot : slots) {
    const bool mine_to_count = !model || names_.sliced.count(slot.name) > 0 || model->rank() == 0;
    counted_in_norm_.push_back(mine_to_count && names_.counted_elsewhere.count(slot.name) == 0);
  }
  if (model) {
    log("[deepspeed.cpp] tensor parallel over " + std::to_string(model->world_size()) + " ranks: " +
        std::to_string(names_.sliced.size()) + " of " + std::to_string(slots.size()) +
        " trainable parameters are slices, the others whole on every model-parallel rank");
  }
}

torch::Tensor ParallelLayout::local_grad_sq_norm(ZeroStage& stage) const {
  return counted_in_norm_.empty() ? stage.local_grad_sq_norm()
                                  : stage.local_grad_sq_norm_of(counted_in_norm_, groups_.data->rank());
}

void ParallelLayout::reduce_norm_and_loss(torch::Tensor& packed) const {
  groups_.data->all_reduce(packed, ReduceOp::kSum).wait();
  if (groups_.model) {
    auto sq = packed.narrow(0, 0, 1);
    groups_.model->all_reduce(sq, ReduceOp::kSum).wait();
  }
  if (groups_.pipe) groups_.pipe->all_reduce(packed, ReduceOp::kSum).wait();
}

void ParallelLayout::describe(CheckpointedState& state) const {
  state.expert_parallel = expert_parallel_;
  if (!split()) return;
  // Each rank writes its own part of the model once: the whole shapes in the manifest, its slices as parts of
  // them, the parameters some other rank counts in the norm (and so holds too) left to that rank.
  state.world = groups_.world;
  state.pipeline_parallel = groups_.pipe ? groups_.pipe->world_size() : 1;
  state.tensor_parallel = groups_.model ? groups_.model->world_size() : 1;
  state.writes_module_state = !groups_.model || groups_.model->rank() == 0;
  for (size_t i = 0; i < slot_names_.size(); ++i) {
    if (!counted_in_norm_[i]) state.written_elsewhere.insert(slot_names_[i]);
  }
  for (auto& p : state.params) {
    const auto it = names_.slices.find(p.name);
    if (it == names_.slices.end()) continue;
    state.slices.emplace(p.name, it->second);
    p.shape = it->second.whole_shape;
  }
}

void ParallelLayout::refuse_split_model(const std::string& what) const {
  if (groups_.model) {
    throw std::logic_error(what + ": not supported yet for a tensor-parallel run (model-parallel group of " +
                           std::to_string(groups_.model->world_size()) +
                           " ranks): each rank holds slices that would be written or read as whole parameters");
  }
  if (expert_parallel_ > 1) {
    throw std::logic_error(what + ": not supported yet with expert parallelism (ep_size " +
                           std::to_string(expert_parallel_) + "): each rank holds only its own experts");
  }
  if (groups_.pipe) {
    throw std::logic_error(what + ": not supported yet for a pipeline-parallel run (" +
                           std::to_string(groups_.pipe->world_size()) +
                           " stages): each rank holds one stage's layers, not the whole model");
  }
}

void ParallelLayout::check_checkpointable(const std::string& what) const {
  if (!split()) return;
  if (!unsliced_param_.empty()) {
    throw std::logic_error(what + ": parameter '" + unsliced_param_ + "' is a tensor-parallel slice whose place in "
                           "the whole parameter is not known (InitOptions::model_parallel_slices; Python's "
                           "initialize(mpu=...) does not give it yet), and a checkpoint holds whole parameters");
  }
  if (!groups_.world) {
    throw std::logic_error(what + ": a " + std::string(groups_.pipe ? "pipeline" : "tensor") + "-parallel run needs "
                           "InitOptions::world_group (every rank of the run: ParallelGroups::world), over which the "
                           "ranks write and read one checkpoint together");
  }
}

}  // namespace dscpp
