// Manifest: the JSON that describes one checkpoint tag — what was trained (config, world size, stage, dtype), where
// training stood (step counters, optimizer step count, loss scaler, schedule position), which parameters exist, and
// for every rank's shard file which fragment of which parameter it holds and the CRC-32 of every tensor and of the
// whole file. It is written last, by rank 0, after every shard file is on disk: a tag with a valid manifest is a
// complete checkpoint.
//
// A fragment is a contiguous range of one flattened parameter — or, written by a tensor-parallel rank, of its slice
// of the parameter (a TensorSlice recorded with the fragment). Because a checkpoint is addressed by parameter and
// element range, never by the writer's flat buffer, a reader with any world size, ZeRO stage, pipeline depth or
// tensor-parallel size finds what its own partition needs (resharding load) and `dscpp consolidate` assembles whole
// parameters one at a time. A pipeline's stages each write their own layers' parameters (a tied one once, by the
// earliest stage holding it), so the files of all ranks together hold the whole model once.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dscpp/checkpoint/tensor_slice.h"

namespace dscpp {

constexpr int kCheckpointFormatVersion = 1;
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kLatestFile = "latest";

// Tensor names inside a shard file: "<kind>/<parameter name>", kind one of these or an optimizer state's name.
constexpr const char* kMasterKind = "master";   // fp32 master weights
constexpr const char* kParam16Kind = "param16"; // compute-dtype weights (16-bit training only)
constexpr const char* kRngTensor = "rng/cpu";   // the rank's CPU generator state
constexpr const char* kRngCudaTensor = "rng/cuda";  // the rank's CUDA generator state (written by GPU runs only)
constexpr const char* kModuleKind = "module";   // a buffer or frozen parameter, whole (rank 0's file only)
// The optimizer's state of one rank at one world size (FlatOptimizer::rank_state, e.g. 1-bit Adam's error feedback),
// by its name: "optimizer_rank/worker_error".
constexpr const char* kOptimizerRankKind = "optimizer_rank";
// Optimizer state every rank holds identically (FlatOptimizer::replicated_state, e.g. 1-bit LAMB's per-tensor
// coefficients), in every rank's file, read back from rank 0's: "optimizer_replicated/last_factor".
constexpr const char* kOptimizerReplicatedKind = "optimizer_replicated";

struct ParamEntry {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

// A tensor of the module the optimizer does not train, saved whole by rank 0: a buffer (BatchNorm's running
// statistics) or a frozen parameter, as DeepSpeed's module state holds them.
struct ModuleStateEntry {
  std::string name;
  std::vector<int64_t> shape;
  torch::ScalarType dtype = torch::kFloat32;  // as saved (JSON: the safetensors spelling, e.g. "F32")
  bool frozen = false;  // a parameter with requires_grad false (else a buffer)
  int rank = 0;         // the file that holds it (a pipeline's stages each write their own layers' buffers)
};

struct Fragment {
  std::string param;
  int64_t begin = 0;  // first element of the flattened parameter (of the flattened slice, when there is one)
  int64_t numel = 0;
  // A tensor-parallel writer's part of the parameter; begin and numel count its elements. Absent: the whole.
  std::optional<TensorSlice> slice;
};

struct ShardFile {
  int rank = 0;
  std::string file;                             // relative to the tag directory
  int64_t bytes = 0;
  uint32_t crc32 = 0;                           // of the whole file
  std::vector<Fragment> fragments;
  std::map<std::string, uint32_t> tensor_crc32;  // every tensor in the file

  nlohmann::json to_json() const;
  // Parses and checks the entry's own keys (not what its fragments refer to: Manifest::from_json does that).
  static ShardFile from_json(const nlohmann::json& json, const std::string& source);
};

struct ScalerEntry {
  std::string type;  // LossScaler::name()
  double scale = 1.0;
  int64_t iteration = 0;
  int64_t last_overflow_iteration = -1;
  int hysteresis = 1;
};

struct Manifest {
  int version = kCheckpointFormatVersion;
  std::string tag;
  int world_size = 1;                 // shard files: one per rank of every axis
  int pipeline_parallel = 1;          // the writer's layout (for the log: any layout reads the checkpoint)
  int tensor_parallel = 1;
  int zero_stage = 0;
  std::string compute_dtype;          // "fp32", "bf16", "fp16"
  int64_t global_steps = 0;
  int64_t micro_steps = 0;
  int64_t skipped_steps = 0;
  int64_t global_samples = 0;         // samples consumed: the data position
  std::string optimizer;              // FlatOptimizer::name()
  int64_t optimizer_step_count = 0;
  std::vector<std::string> optimizer_state;  // state tensor kinds, e.g. exp_avg, exp_avg_sq
  std::string scheduler;              // the schedule's type ("" = constant lr)
  int64_t scheduler_position = 0;     // the steps it has applied (global - skipped unless a load reset it)
  ScalerEntry loss_scaler;
  std::vector<ParamEntry> params;     // the model's trainable parameters, in registration order
  std::vector<ModuleStateEntry> module_state;  // buffers and frozen parameters, in rank 0's file (absent: none)
  std::vector<ShardFile> files;       // one per rank, by rank
  nlohmann::json config;              // the resolved DeepSpeed config
  nlohmann::json client_state;        // whatever the program passed to save_checkpoint (null if nothing)

  nlohmann::json to_json() const;
  // Throws CheckpointError naming `source` (the manifest's path) and the key that is missing or wrong.
  static Manifest from_json(const nlohmann::json& json, const std::string& source);
  // Reads and validates `tag_dir`/manifest.json.
  static Manifest read(const std::string& tag_dir);
};

// Every way a checkpoint can be unusable: missing, incomplete, corrupt, or from another model. The message names
// the file and what is wrong.
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

nlohmann::json to_json(const ParamEntry& p);
ParamEntry param_entry_from_json(const nlohmann::json& json, const std::string& source);
nlohmann::json to_json(const ModuleStateEntry& e);
ModuleStateEntry module_state_entry_from_json(const nlohmann::json& json, const std::string& source);

// "<kind>/<param>" — the tensor's name in a shard file.
std::string shard_tensor_name(const std::string& kind, const std::string& param);
// "rank_00003.safetensors".
std::string shard_file_name(int rank);

}  // namespace dscpp
