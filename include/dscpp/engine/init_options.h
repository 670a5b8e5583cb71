// InitOptions: what a program gives initialize besides the model and the config: one options struct (as
// leveldb's), each field's default stated beside it; every field empty is a single-process data-parallel run.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dscpp/checkpoint/tensor_slice.h"
#include "dscpp/comm/comm.h"
#include "dscpp/engine/partitioned_init.h"
#include "dscpp/optim/options.h"

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
  // An engine that will not train (DeepSpeed's engine built without an optimizer: a reference model, ZeRO-Inference).
  // Every parameter is then held as a frozen one is, with no fp32 master, no gradient buffer and no optimizer state:
  // under ZeRO-3 partitioned, so a rank holds its shard of the weights and nothing else (with offload_param, not even
  // that in memory); at stages 0-2 whole on every rank, in the compute dtype, rank 0's values. backward and step are
  // refused (std::logic_error); the optimizer may be absent. load_checkpoint puts a checkpoint's trained parameters
  // into them. Models with sliced or expert parameters keep their parameters as they would to train.
  bool forward_only = false;
  // The program acts on the config's "compression_training" (Python: initialize attaches dscpp.compression's
  // schedule to the engine's steps). The engine itself does not touch the model's modules, so without this a config
  // with a compression technique switched on is refused naming the key rather than trained uncompressed.
  bool compression_applied = false;
  // The model computes its attention as the config's "sparse_attention" says (gpt-train --sparse_attention; Python:
  // the model holds dscpp.ops.sparse_attention.SparseSelfAttention modules). The section describes the model's
  // attention, which the engine does not build, so without this it is refused naming the key.
  bool sparse_attention_applied = false;
  // Where each sliced parameter sits in the whole one (TensorSlice::part; tensor_parallel_slices() of the model's
  // layers): checkpoints write and read the slices as parts of the whole named parameters, so a checkpoint of one
  // layout loads on any other. Its names count as model_parallel_params.
  std::map<std::string, TensorSlice> model_parallel_slices;
  // Model or pipeline parallelism: every rank of the run (ParallelGroups::world), over which checkpoints are saved
  // and loaded together. (A PipelineEngine gives its stage engines this and the next one from its ParallelGroups:
  // leave both empty there.)
  std::shared_ptr<Comm> world_group;
  // Pipeline parallelism (a PipelineEngine's; `comm` is then the data-parallel group): the ranks that hold the
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

}  // namespace dscpp
