// The engine over a model split across ranks: tensor- and pipeline-parallel groups (which gradients this rank counts
// in the norm), expert parallelism (which parameters are experts, averaged over their own group), and what each of
// these layouts cannot do yet. Engine::build calls the first two; the checks guard the API that needs a whole model.
#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "dscpp/engine/engine.h"

namespace dscpp {

void Engine::set_model_parallel(const InitOptions& options) {
  const auto& slots = stage_->layout().slots();
  std::set<std::string> sliced = options.model_parallel_params;
  for (const auto& [name, slice] : options.model_parallel_slices) sliced.insert(name);
  using Names = const std::set<std::string>*;
  for (const auto* names : std::initializer_list<Names>{&sliced, &options.norm_counted_elsewhere}) {
    std::set<std::string> unknown = *names;
    for (const auto& slot : slots) unknown.erase(slot.name);
    if (!unknown.empty()) {
      throw std::invalid_argument(std::string("InitOptions::") +
                                  (names == &sliced ? "model_parallel_params (or _slices)"
                                                                           : "norm_counted_elsewhere") +
                                  " names '" + *unknown.begin() +
                                  "', which is not a trainable parameter of this model");
    }
  }
  // A group of one rank is the whole model along that axis: nothing to join.
  if (options.model_parallel_group && options.model_parallel_group->world_size() > 1) {
    model_group_ = options.model_parallel_group;
  }
  if (options.pipeline_group && options.pipeline_group->world_size() > 1) pipe_group_ = options.pipeline_group;
  world_group_ = options.world_group;
  if (!model_group_ && !pipe_group_) return;
  for (const auto& slot : slots) {
    const auto it = options.model_parallel_slices.find(slot.name);
    if (it == options.model_parallel_slices.end()) {
      if (model_group_ && sliced.count(slot.name) && unsliced_param_.empty()) unsliced_param_ = slot.name;
    } else if (it->second.shape() != slot.shape) {
      throw std::invalid_argument("InitOptions::model_parallel_slices: '" + slot.name + "' is a slice of shape " +
                                  c10::str(c10::IntArrayRef(it->second.shape())) + " of " +
                                  c10::str(c10::IntArrayRef(it->second.whole_shape)) + ", the parameter is " +
                                  c10::str(c10::IntArrayRef(slot.shape)));
    }
  }
  for (const auto& slot : slots) {
    const bool mine = !model_group_ || sliced.count(slot.name) > 0 || model_group_->rank() == 0;
    counted_in_norm_.push_back(mine && options.norm_counted_elsewhere.count(slot.name) == 0);
  }
  if (model_group_) {
    log_("[deepspeed.cpp] tensor parallel over " + std::to_string(model_group_->world_size()) + " ranks: " +
         std::to_string(sliced.size()) + " of " + std::to_string(slots.size()) +
         " trainable parameters are slices, the others whole on every model-parallel rank");
  }
}

void Engine::check_checkpointable(const std::string& what) const {
  if (!model_group_ && !pipe_group_) return;
  if (!unsliced_param_.empty()) {
    throw std::logic_error(what + ": parameter '" + unsliced_param_ + "' is a tensor-parallel slice whose place in "
                           "the whole parameter is not known (InitOptions::model_parallel_slices; Python's "
                           "initialize(mpu=...) does not give it yet), and a checkpoint holds whole parameters");
  }
  if (!world_group_) {
    throw std::logic_error(what + ": a " + (pipe_group_ ? "pipeline" : "tensor") + "-parallel run needs "
                           "InitOptions::world_group (every rank of the run: ParallelGroups::world), over which the "
                           "ranks write and read one checkpoint together");
  }
}

std::vector<bool> Engine::expert_flags(const InitOptions& options, const std::vector<std::string>& names) {
  const auto& group = options.expert_data_parallel_group;
  const int data = comm_->world_size();
  if (group && (group->world_size() < 1 || data % group->world_size() != 0)) {
    throw std::invalid_argument("InitOptions::expert_data_parallel_group has " + std::to_string(group->world_size()) +
                                " ranks, which does not divide the data-parallel size " + std::to_string(data));
  }
  expert_parallel_ = group ? data / group->world_size() : 1;
  if (model_expert_parallel_ > 1 && model_expert_parallel_ != expert_parallel_) {
    throw std::invalid_argument("the model's MoE layers spread their experts over ep_size " +
                                std::to_string(model_expert_parallel_) + " ranks but the engine was given " +
                                (group ? "an expert-data-parallel group for ep_size " + std::to_string(expert_parallel_)
                                       : std::string("no expert-data-parallel group")) +
                                ": pass InitOptions::expert_data_parallel_group from moe::make_expert_groups(comm, " +
                                std::to_string(model_expert_parallel_) + ")");
  }
  if (expert_parallel_ == 1) return {};
  if (options.expert_params.empty()) {
    throw std::invalid_argument("InitOptions::expert_data_parallel_group is given (ep_size " +
                                std::to_string(expert_parallel_) + ") but no parameter is an expert: name them in "
                                "InitOptions::expert_params (moe::expert_parameter_names)");
  }
  std::set<std::string> unknown = options.expert_params;
  std::vector<bool> flags;
  for (const auto& name : names) flags.push_back(unknown.erase(name) > 0);
  if (!unknown.empty()) {
    throw std::invalid_argument("InitOptions::expert_params names '" + *unknown.begin() +
                                "', which is not a trainable parameter of this model");
  }
  return flags;
}

void Engine::check_not_model_parallel(const std::string& what) const {
  if (model_group_) {
    throw std::logic_error(what + ": not supported yet for a tensor-parallel run (model-parallel group of " +
                           std::to_string(model_group_->world_size()) +
                           " ranks): each rank holds slices that would be written or read as whole parameters");
  }
  if (expert_parallel_ > 1) {
    throw std::logic_error(what + ": not supported yet with expert parallelism (ep_size " +
                           std::to_string(expert_parallel_) + "): each rank holds only its own experts");
  }
  if (pipe_group_) {
    throw std::logic_error(what + ": not supported yet for a pipeline-parallel run (" +
                           std::to_string(pipe_group_->world_size()) +
                           " stages): each rank holds one stage's layers, not the whole model");
  }
}

}  // namespace dscpp
