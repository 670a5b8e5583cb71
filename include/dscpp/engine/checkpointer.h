// Checkpointer: the engine's training state to and from the checkpoint format (dscpp/checkpoint/manifest.h). The
// engine sequences a step; this object serialises what the step left: each rank's fp32 master and optimizer state as
// fragments of named parameters, the counters, the loss scaler and the generators. Every rank writes the fragments
// its partition holds and reads the fragments its partition needs, so the reader's world size and ZeRO stage need not
// be the writer's.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dscpp/checkpoint/manifest.h"
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
  Comm& comm;
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
    torch::Tensor tensor;
    bool frozen = false;
  };
  std::vector<ModuleTensor> module_state;
  torch::ScalarType dtype;         // the compute dtype (16-bit weights are saved in it)
  torch::Device device;            // where training runs (a GPU's generator is saved too)
  std::function<void(const std::string&)> log;
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
    ShardFragment fragment;  // unused for kRngTensor and kModuleKind
    int module = -1;         // kModuleKind: its index in CheckpointedState::module_state
  };

  int rank() const { return s_.comm.rank(); }
  int world_size() const { return s_.comm.world_size(); }
  void check_at_boundary(const char* what) const;
  void validate_tag_across_ranks(const std::string& tag) const;
  // What rank `r`'s shard file holds, in file order. Rank 0 names every rank's checksums from it, so writer and
  // manifest cannot disagree.
  // `modules`: the module_state entries this save writes (saved_module_state), in rank 0's file.
  std::vector<ShardTensor> shard_contents(int r, const std::vector<int>& modules) const;
  // Writes this rank's shard into `staging`; returns its bytes, file CRC and each tensor's CRC (shard_contents order).
  std::vector<int64_t> write_shard(const std::string& staging, const std::string& tag, const std::vector<int>& modules);
  // The manifest without its files: what this engine is and where training stands.
  Manifest describe_checkpoint(const std::string& tag, const nlohmann::json& client_state,
                               const std::vector<int>& modules) const;
  // Rank `r`'s entry in the manifest, from the sizes and checksums it reported (write_shard's order).
  ShardFile describe_shard(int r, const std::vector<int64_t>& sums, const std::vector<int>& modules) const;
  // After a load's weights: counters, loss scaler, this rank's generator (when the checkpoint has one for it).
  void restore_progress(const Manifest& m, const torch::Tensor& rng_state, const torch::Tensor& cuda_rng_state,
                        bool schedule_position);
  // Each module_state entry's saved value (undefined: the checkpoint has none, it keeps its own).
  std::vector<torch::Tensor> read_module_state(CheckpointReader& checkpoint, const std::string& source) const;
  // Throws CheckpointError unless `m` is this model (and, when loading it, this optimizer's state).
  void check_compatible(const Manifest& m, const CheckpointLoadOptions& options, const std::string& source) const;
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
