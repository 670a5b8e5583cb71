// ParallelLayout: how this rank's model is split across ranks, and everything that follows from it for the engine —
// the data, tensor-, pipeline- and expert-parallel groups; which gradients this rank counts in the norm; the
// reductions a step runs beyond the data-parallel one; the parallel fields of a checkpoint; and what a split model
// cannot do yet. The engine asks it; it never asks the engine.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dscpp/checkpoint/tensor_slice.h"
#include "dscpp/comm/comm.h"
#include "dscpp/config/config.h"
#include "dscpp/engine/checkpointer.h"
#include "dscpp/engine/init_options.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

class ParallelLayout {
 public:
  // The groups. Only `data` is required; an axis the run does not split along is null (a group of one rank is the
  // same as none).
  struct Groups {
    std::shared_ptr<Comm> data;         // ZeRO's group: the ranks holding the same part of the model
    std::shared_ptr<Comm> model;        // tensor parallelism (InitOptions::model_parallel_group)
    std::shared_ptr<Comm> pipe;         // pipeline parallelism (InitOptions::pipeline_group)
    std::shared_ptr<Comm> world;        // every rank of the run, for checkpoints (InitOptions::world_group)
    std::shared_ptr<Comm> expert_data;  // ranks holding the same experts (InitOptions::expert_data_parallel_group)
    static Groups of(const InitOptions& options);  // `data` from InitOptions::comm (null when the engine makes it)
  };

  // Which trainable parameters the axes concern, by name (InitOptions says what each set means).
  struct Names {
    std::set<std::string> sliced;                // model_parallel_params and the names of model_parallel_slices
    std::map<std::string, TensorSlice> slices;   // model_parallel_slices
    std::set<std::string> counted_elsewhere;     // norm_counted_elsewhere
    std::set<std::string> experts;               // expert_params
    // A pipeline stage's engine holds only its own layers: names of other stages' parameters are passed over
    // rather than refused as unknown.
    bool other_stages_named = false;
    static Names of(const InitOptions& options);
  };

  // Checks the groups against each other and the config: tensor_parallel.autotp_size against the model group,
  // the expert group against the data-parallel size and the model's own MoE layers (`model_expert_parallel`: their
  // largest ep_size, 1 without), ZeRO-3 against expert parallelism. std::invalid_argument / ConfigError naming them.
  ParallelLayout(Groups groups, Names names, const Config& config, int model_expert_parallel = 1);

  Comm& data() const { return *groups_.data; }
  const std::shared_ptr<Comm>& data_group() const { return groups_.data; }
  // comms_logger: the data group replaced by its logging decorator, so the step's reductions are counted too.
  void set_data_group(std::shared_ptr<Comm> data) { groups_.data = std::move(data); }
  // The tensor-parallel group (null without), the default for activation partitioning.
  const std::shared_ptr<Comm>& model_group() const { return groups_.model; }
  // Expert parallelism: the experts' own group (null without) and how many data-parallel ranks share out the experts.
  const std::shared_ptr<Comm>& expert_data_group() const { return groups_.expert_data; }
  int expert_parallel() const { return expert_parallel_; }

  // Stages 0-2: per trainable parameter (`trainable`, the stage's order), whether it is an expert. Empty without
  // expert parallelism. std::invalid_argument for an expert name that is not among them.
  std::vector<bool> expert_flags(const std::vector<std::string>& trainable) const;

  // Once the stage has laid out the trainable parameters: checks the names against them and fixes which gradients
  // this rank counts in the norm (its slices on every model-parallel rank, whole parameters on model-parallel
  // rank 0 only, not a tied copy another stage counts). Logs what the split is.
  void bind(const std::vector<ParamSlot>& slots, const std::function<void(const std::string&)>& log);

  // The step's one reduction of the gradient norm and the loss: `packed` = [this rank's share of ‖g‖² (stage
  // gives it, local_grad_sq_norm), its loss sum], summed over the data group, the norm also over the model group
  // (its slices; the loss is the same on each), both over the pipeline (the stages' shares; only the last has a
  // loss).
  torch::Tensor local_grad_sq_norm(ZeroStage& stage) const;
  void reduce_norm_and_loss(torch::Tensor& packed) const;

  // The parallel fields of what a checkpoint saves (CheckpointedState: world group, sizes, slices with their
  // whole shapes, what another rank writes).
  void describe(CheckpointedState& state) const;

  // Refuses what a split model cannot do yet (a whole-model read or write), naming `what`.
  void refuse_split_model(const std::string& what) const;
  // Refuses a checkpoint of a model-parallel run without what it needs (world group, a slice of every sliced
  // parameter), naming `what` and the option.
  void check_checkpointable(const std::string& what) const;

 private:
  bool split() const { return groups_.model || groups_.pipe; }

  Groups groups_;
  Names names_;
  int expert_parallel_ = 1;
  std::vector<std::string> slot_names_;  // bind's slots, in order
  std::vector<bool> counted_in_norm_;    // per slot; empty unless split()
  std::string unsliced_param_;           // a sliced parameter without a TensorSlice ("" when every one has one)
};

}  // namespace dscpp
