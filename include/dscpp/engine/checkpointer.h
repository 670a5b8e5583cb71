// Checkpointer: the engine's training state to and from the checkpoint format (dscpp/checkpoint/manifest.h). The
// engine sequences a step; this object serialises what the step left: each rank's fp32 master and optimizer state as
// fragments of named parameters, the counters, the loss scaler and the generators. Every rank writes the fragments
// its partition holds and reads the fragments its partition needs, so the reader's world size and ZeRO stage need not
// be the writer's. With model parallelism each rank's engine holds part of the model: a pipeline stage its layers, a
// tensor-parallel rank slices (TensorSlice) — it writes them as fragments of the whole named parameters, and reads
// its part of whatever layout wrote them, so a 3D checkpoint loads on one process and the other way round.
//
// A save, collective over every rank of the run: each rank writes its shard file and a description of it (its
// fragments, its parameters' whole shapes, its module tensors) into the staging directory; then rank 0 of the run
// merges the descriptions into the manifest and publishes the tag.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/checkpoint/manifest.h"
#include "dscpp/checkpoint/tensor_slice.h"
#include "dscpp/comm/comm.h"
#include "dscpp/config/config.h"
#include "dscpp/engine/progress.h"
#include "dscpp/offload/optimizer_offload.h"
#include "dscpp/optim/flat_optimizer.h"
#include "dscpp/precision/loss_scaler.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

class CheckpointReader;

struct CheckpointLoadOptions {
  // false: weights and step counters only; the optimizer's state is left as it is (fresh in a new engine), so the
  // checkpoint's optimizer need not be this one.
  bool load_optimizer_states = true;
  // false: the LR schedule keeps this engine's position (0 in a new engine: the schedule starts over, warmup and
  // all) instead of the checkpoint's; the step counters are still the checkpoint's (DeepSpeed's
  // load_lr_scheduler_states).
  bool load_lr_scheduler_states = true;
  // true: the weights only; optimizer state, step counters, LR schedule, loss scaler and generators stay as this
  // engine has them (DeepSpeed's load_module_only, e.g. to fine-tune from a pretraining checkpoint).
  bool load_module_only = false;
  // false: parameters this model has and the checkpoint does not keep their values (and optimizer state), and the
  // checkpoint's parameters this model does not have are ignored; a parameter both have must still agree in shape
  // (DeepSpeed's load_module_strict, torch's load_state_dict(strict=False)).
  bool load_module_strict = true;
};

struct CheckpointSaveOptions {
  // false: the tag is written, but `latest` keeps naming the one it named (DeepSpeed's save_latest).
  bool save_latest = true;
  // true: frozen parameters are left out (DeepSpeed's exclude_frozen_parameters); a load keeps the model's own.
  bool exclude_frozen_parameters = false;
};

struct LoadedCheckpoint {
  std::string path;              // the tag directory read
  std::string tag;
  nlohmann::json client_state;   // what save_checkpoint was given (null when nothing)
};

// The engine's parts a checkpoint reads and writes. The engine owns them all; they outlive the Checkpointer.
struct CheckpointedState {
  const Config& config;
  Comm& comm;  // the data-parallel group the ZeRO stage partitions over
  ZeroStage& stage;
  FlatOptimizer& optimizer;
  OptimizerOffload* offload;  // offload_optimizer: the master and optimizer state live in its store; else null
  LossScaler& scaler;
  TrainingProgress& progress;
  std::vector<ParamEntry> params;  // the trainable parameters' names and shapes, in registration order
  // The module's tensors the optimizer does not train: buffers and frozen parameters. Rank 0's are saved (as
  // DeepSpeed saves rank 0's module state) and every rank loads them.
  struct ModuleTensor {
    std::string name;
    torch::Tensor tensor;  // empty between uses where the stage partitions it (ZeroStage::partitions_frozen)
    bool frozen = false;
    std::vector<int64_t> shape;  // the whole tensor's
  };
  std::vector<ModuleTensor> module_state;
  torch::ScalarType dtype;         // the compute dtype (16-bit weights are saved in it)
  torch::Device device;            // where training runs (a GPU's generator is saved too)
  std::function<void(const std::string&)> log;

  // Model parallelism (unset without it). `world`: every rank of the run, over which saves and loads are collective;
  // null: `comm` is the whole run.
  std::shared_ptr<Comm> world;
  int pipeline_parallel = 1, tensor_parallel = 1;  // recorded in the manifest
  // The parameters this rank holds a slice of, and where the slice sits in the whole (`params` has whole shapes).
  std::map<std::string, TensorSlice> slices;
  // Parameters another rank writes: on tensor-parallel ranks other than the first, the ones every rank holds whole;
  // on a later stage, its copy of a tied parameter.
  std::set<std::string> written_elsewhere;
  // This rank's data-parallel group writes the module tensors (false on tensor-parallel ranks other than the first,
  // which hold the same ones).
  bool writes_module_state = true;
  // Mixture of Experts: experts spread over this many data-parallel ranks, so no rank holds the whole model.
  int expert_parallel = 1;
  // Built without an optimizer (InitOptions::forward_only): `params` is empty and every parameter is a frozen
  // module_state entry, into which a checkpoint's trained parameters load (their fp32 master in the compute dtype, as
  // the training run's own weights were published from it). No optimizer state is read.
  bool forward_only = false;
};

class Checkpointer {
 public:
  explicit Checkpointer(CheckpointedState state) : s_(std::move(state)) {}

  // See Engine::save_checkpoint / load_checkpoint / load_weights, which call these.
  std::string save(const std::string& save_dir, const std::string& tag, const nlohmann::json& client_state,
                   const CheckpointSaveOptions& options = {});
  LoadedCheckpoint load(const std::string& load_dir, const std::string& tag, const CheckpointLoadOptions& options);
  using WeightSource = std::function<torch::Tensor(const std::string& name, const std::vector<int64_t>& shape)>;
  // `wanted(name)` false: that parameter keeps its value (null: every parameter is set).
  void load_weights(const WeightSource& source, const std::function<bool(const std::string&)>& wanted = nullptr);

 private:
  // One tensor of a shard file: `kind` (kMasterKind, an optimizer state, kParam16Kind, kRngTensor) of a fragment.
  struct ShardTensor {
    std::string name;  // in the file
    std::string kind;
    ShardFragment fragment;  // unused for kRngTensor, kModuleKind and the optimizer's rank and replicated kinds
    // kModuleKind: its index in CheckpointedState::module_state; kOptimizerRankKind: in the optimizer's
    // rank_state(); kOptimizerReplicatedKind: in its replicated_state()
    int index = -1;
  };

  int rank() const { return s_.comm.rank(); }  // in the data-parallel group: the ZeRO partition's
  Comm& world() const { return s_.world ? *s_.world : s_.comm; }
  int world_rank() const { return world().rank(); }
  int world_size() const { return world().world_size(); }
  // False with model parallelism: ranks beyond this data-parallel group hold the other stages or slices.
  bool holds_whole_model() const { return world_size() == s_.comm.world_size() && s_.expert_parallel == 1; }
  void check_at_boundary(const char* what) const;
  void validate_tag_across_ranks(const std::string& tag) const;
  // What this rank's shard file holds, in file order. `modules`: the module_state entries this save writes
  // (saved_module_state), when this rank writes them.
  std::vector<ShardTensor> shard_contents(const std::vector<int>& modules) const;
  bool writes_module_state() const { return rank() == 0 && s_.writes_module_state; }
  // Writes this rank's shard into `staging` and, beside it, its description (describe_shard, the parameters' whole
  // shapes and the module tensors it holds) for rank 0 of the run to merge.
  // `assembled`: the module tensors the stage keeps partitioned, whole (assemble_frozen).
  void write_shard(const std::string& staging, const std::string& tag, const std::vector<int>& modules,
                   const std::map<int, torch::Tensor>& assembled);
  std::map<int, torch::Tensor> assemble_frozen(const std::vector<int>& modules);
  std::vector<int64_t> module_shape(const CheckpointedState::ModuleTensor& t) const;
  // The manifest without its parameters and files: where training stands, the same on every rank.
  Manifest describe_checkpoint(const std::string& tag, const nlohmann::json& client_state) const;
  // This rank's entry in the manifest, from the sizes and checksums the writer gave.
  ShardFile describe_shard(const std::vector<ShardTensor>& contents, int64_t bytes, uint32_t crc32,
                           const std::vector<uint32_t>& tensor_crc32) const;
  // Rank 0 of the run: every rank's description into `m` (parameters in rank order, each once), then removed.
  void merge_descriptions(const std::string& staging, Manifest& m) const;
  // After a load's weights: counters, loss scaler, this rank's generator (when the checkpoint has one for it).
  void restore_progress(const Manifest& m, const torch::Tensor& rng_state, const torch::Tensor& cuda_rng_state,
                        bool schedule_position);
  // This rank's saved value of each of the optimizer's rank_state() entries (undefined: none for this world size).
  std::vector<torch::Tensor> read_rank_state(CheckpointReader& checkpoint) const;
  // The first rank's saved value of each of the optimizer's replicated_state() entries (undefined: not saved).
  std::vector<torch::Tensor> read_replicated_state(CheckpointReader& checkpoint) const;
  // Each module_state entry's saved value (undefined: the checkpoint has none, it keeps its own).
  std::vector<torch::Tensor> read_module_state(CheckpointReader& checkpoint, const std::string& source) const;
  // Forward only: the checkpoint's trained parameters' values in their module tensors' dtype — into `module_values`
  // (read_module_state's) whole, or into `shard_pieces` only the elements this rank's shard keeps where the stage
  // keeps the parameter sharded (ZeroStage::frozen_shard_range): a rank never reads the whole model.
  void read_trained_into_frozen(CheckpointReader& checkpoint, std::vector<torch::Tensor>& module_values,
                                std::vector<torch::Tensor>& shard_pieces) const;
  // Forward only: throws CheckpointError unless the checkpoint's trained parameters are this model's frozen ones
  // (names and shapes; `strict`: and each of this model's parameters is in the checkpoint, trained or not).
  void check_forward_only_model(const Manifest& m, const std::string& source, bool strict) const;
  // Throws CheckpointError unless `m` is this model (and, when loading it, this optimizer's state). With model
  // parallelism this rank checks its own parameters; check_all_held checks that the run holds all of the checkpoint's.
  void check_compatible(const Manifest& m, const CheckpointLoadOptions& options, const std::string& source) const;
  void check_all_held(const Manifest& m, const std::string& source) const;
  const TensorSlice* slice_of(const std::string& param) const;
  // The module_state entries a save writes (in order): all, or the buffers alone.
  std::vector<int> saved_module_state(const CheckpointSaveOptions& options) const;
  // The parts of parameters this rank's master holds: every parameter whole (stage 0) or its shards' fragments.
  std::vector<ShardFragment> master_fragments() const;
  // Which part of the stage's master_params() holds fragment `f` of this rank's layout.
  int64_t master_offset(const ShardFragment& f) const;
  // Elements [offset, offset + numel) of the master (kind 0) or optimizer state kind - 1, wherever they live: a view
  // when they are in memory, a copy read from the offload store otherwise.
  torch::Tensor master_state(int kind, int64_t offset, int64_t numel);
  // Sets parts of the master and optimizer state (addressed as master_state does; fp32 values on the host) and
  // republishes the compute-dtype weights from them.
  void commit_master_writes(const std::vector<StateStore::Update>& writes);

  CheckpointedState s_;
};

}  // namespace dscpp
