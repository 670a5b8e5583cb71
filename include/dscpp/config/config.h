// Config: a DeepSpeed JSON config parsed into typed values, every default filled and every "auto" resolved.
// Parsing validates everything up front, so a bad config fails at load with the key named, not hours later.
// Torch-free: this layer is shared by the engine and the `dscpp plan` dry run.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "dscpp/config/batch.h"
#include "dscpp/config/compression.h"
#include "dscpp/config/sparse_attention.h"
#include "dscpp/config/config_error.h"
#include "dscpp/optim/options.h"
#include "dscpp/precision/loss_scaler.h"
#include "dscpp/schedule/options.h"

namespace dscpp {

enum class DType { kFloat32, kFloat16, kBFloat16 };
std::string to_string(DType dtype);

enum class OffloadDevice { kNone, kCpu, kNvme };

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  bool pin_memory = false;
  int buffer_count = 4;
  bool fast_init = false;
  double ratio = 1.0;
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  bool pin_memory = false;
  int buffer_count = 5;
  int64_t buffer_size = 100'000'000;   // elements
  int64_t max_in_cpu = 1'000'000'000;  // elements
};

// "zero_optimization". Bucket sizes count elements, as in DeepSpeed.
struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500'000'000;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500'000'000;
  bool overlap_comm = false;            // default true for stage 3 (resolved at parse)
  int64_t sub_group_size = 1'000'000'000;
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  // The most elements all persistent parameters may hold together (zero/persistence.h); unbounded by default.
  int64_t stage3_model_persistence_threshold = std::numeric_limits<int64_t>::max();
  int64_t stage3_max_live_parameters = 1'000'000'000;
  int64_t stage3_max_reuse_distance = 1'000'000'000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  bool round_robin_gradients = false;
  bool quantized_weights = false;  // "zero_quantized_weights": ZeRO++ qwZ, stage 3 (zero_stage.h: StageContext)
  // "zero_quantized_nontrainable_weights": frozen parameters' shards stored as int8 blocks, stage 3 (StageContext)
  bool quantized_nontrainable_weights = false;
  int64_t hpz_partition_size = 1;  // "zero_hpz_partition_size": ZeRO++ hpZ, stage 3; 1 = off
  bool quantized_gradients = false;  // "zero_quantized_gradients": ZeRO++ qgZ, stage 3
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
};

// "aio": async I/O for NVMe offload.
struct AioConfig {
  // O_DIRECT transfers need buffers, lengths and offsets aligned to the device's logical block; 4 KiB covers every
  // device in use. block_size must be a multiple (checked when the config is read, so `plan` refuses it too).
  static constexpr int64_t kAlignment = 4096;
  int64_t block_size = 1'048'576;       // bytes
  int queue_depth = 8;
  int intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

// "tensorboard", "csv_monitor", "wandb".
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;              // "" = current directory
  std::string job_name = "DeepSpeedJobName";
};

struct FlopsProfilerConfig {
  bool enabled = false;
  int64_t profile_step = 1;
  int module_depth = -1;
  int top_modules = 1;
  bool detailed = true;
  std::string output_file;
  double recompute_fwd_factor = 0.0;  // forwards recomputed in backward (activation checkpointing), in forwards
};

struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;                // one line per collective as it completes (rank 0)
  bool prof_all = true;                // false: only the ops in prof_ops
  bool debug = false;                  // verbose on every rank, each line naming its rank
  std::vector<std::string> prof_ops;   // all_reduce, reduce_scatter, all_gather, broadcast, barrier
};

struct CheckpointConfig {
  std::string tag_validation = "Warn";  // "Ignore", "Warn", "Fail"
  bool load_universal = false;         // accepted; every checkpoint here is universal (loads on any world / stage)
};

// "pipeline": DeepSpeed's pipeline section, read here by PipelineEngine (DeepSpeed's PipelineModule takes the same
// settings as arguments).
struct PipelineConfig {
  int stages = 1;  // "stages"; DeepSpeed's "auto" (the program's PipelineModule decides) reads as 1 until it does
  // "partition": parameters, uniform or type:REGEX (see partition_layers); DeepSpeed's default "best", which its
  // PipelineModule never reads, is its partition_method default, "parameters".
  std::string partition = "parameters";
  int activation_checkpoint_interval = 0;  // 0: no activation checkpointing of the stage's layers
};

// "hybrid_engine": DeepSpeed's switch for generation inside training (DeepSpeed-Chat's actor). It changes only what a
// training engine's generate() does, which the Python front end has (dscpp.runtime.hybrid_engine): with
// pin_parameters, ZeRO-3 gathers every parameter once per generate() call instead of each block per forward; with
// inference_tp_size > 1 each group of that many consecutive ranks generates their prompts together over the model's
// layers sliced among them (AutoTP), each rank taking back its own rows.
struct HybridEngineConfig {
  bool enabled = false;
  int64_t max_out_tokens = 512;          // accepted: it sizes DeepSpeed's inference kernels' workspace, not here
  bool pin_parameters = true;            // ZeRO-3: gather all parameters once per generate() (false: per forward)
  bool release_inference_cache = false;  // accepted either way: nothing gathered outlives a generate() call here
  int64_t tp_gather_partition_size = 8;  // DeepSpeed's layers per gather with inference_tp_size > 1 (accepted)
  int64_t inference_tp_size = 1;         // ranks per tensor-parallel generation group (needs pin_parameters)
};

struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  LossScalerOptions scaler;             // loss_scale, initial_scale_power, loss_scale_window, hysteresis, ...
};

// Values the program supplies for "auto" (HF-style flags, the world size, the model's hidden size).
// Keys are dotted config paths ("optimizer.params.lr"). `from_hf_args` maps HF Trainer flags onto them.
struct AutoValues {
  std::map<std::string, nlohmann::json> values;
  // The program's own micro-batch when no flag names one: fills train_micro_batch_size_per_gpu ("auto" or absent)
  // only where the config's numbers leave it free — neither train_batch_size nor the micro-batch is a number —
  // so a default never contradicts a batch the config states (the triangle solves the micro-batch then).
  std::optional<int64_t> default_micro_batch;

  // HF Trainer-style arguments; unset ones fill nothing.
  struct HfArgs {
    std::optional<double> lr, weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm;
    std::optional<int64_t> micro_batch, grad_accum, warmup_steps, total_steps, hidden_size;
    std::optional<bool> fp16, bf16;
    // With micro_batch and grad_accum, fills train_batch_size = world × micro × gas (as HF does); without it
    // an "auto" train_batch_size is solved by the batch triangle from ConfigOptions::world_size instead.
    std::optional<int64_t> world_size;
    std::optional<int64_t> default_micro_batch;  // see AutoValues::default_micro_batch
  };
  // Betas and eps are always filled (HF's defaults 0.9, 0.999, 1e-8 when unset), as the HF Trainer does;
  // scheduler.params.warmup_min_lr is always 0; one of fp16/bf16 set fills both enabled flags.
  static AutoValues from_hf_args(const HfArgs& args);
};

struct ConfigOptions {
  int world_size = 1;                   // data-parallel size: the batch triangle's third side
  AutoValues auto_values;               // fills "auto"; batch keys are also filled when absent
  std::map<std::string, nlohmann::json> overrides;  // `--set key=value`: applied before parsing
  std::function<void(const std::string&)> warn;     // unknown-key warnings; default prints to stderr
};

struct Config {
  BatchConfig batch;                    // train_batch_size = micro × grad_accum × world_size, resolved
  double gradient_clipping = 1.0;       // 0 = off; 1.0 is DeepSpeed 0.19.8's default
  int64_t steps_per_print = 10;
  bool wall_clock_breakdown = false;
  bool memory_breakdown = false;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::optional<DType> communication_data_type;  // nullopt = the compute dtype
  // DeepSpeed-Ulysses: the ranks that split each sequence (consecutive ranks of the data-parallel group, which ZeRO
  // partitions over and gradients are summed over; they are averaged over the data-parallel size alone, world /
  // (tensor x pipeline x this), which is also the batch triangle's third side). With it > 1 the gradients are
  // communicated in seq_parallel_communication_data_type, as DeepSpeed's engine does.
  int sequence_parallel_size = 1;
  DType seq_parallel_communication_data_type = DType::kFloat32;
  std::optional<DType> grad_accum_dtype;          // "data_types.grad_accum_dtype"; nullopt = the stage's own
  Fp16Config fp16;
  bool bf16 = false;                    // "bf16.enabled" (alias "bfloat16")
  std::optional<OptimizerConfig> optimizer;
  std::optional<SchedulerConfig> scheduler;
  ZeroConfig zero;
  AioConfig aio;
  ActivationCheckpointingConfig activation_checkpointing;
  MonitorConfig tensorboard, csv_monitor, wandb;
  FlopsProfilerConfig flops_profiler;
  CommsLoggerConfig comms_logger;
  CheckpointConfig checkpoint;
  // "tensor_parallel.autotp_size" (0 and 1: none): the ranks each replica of the model is sliced over. The engine
  // does not slice a model itself: the program builds it sliced over InitOptions::model_parallel_group, of this size.
  int tensor_parallel_size = 1;
  PipelineConfig pipeline;
  HybridEngineConfig hybrid_engine;
  CompressionConfig compression;        // "compression_training" (python/dscpp/compression acts on it)
  std::optional<SparsityConfig> sparse_attention;  // "sparse_attention", when present (the model applies it)

  // The compute (model) dtype: fp16, bf16 or fp32.
  DType compute_dtype() const;

  // The input JSON with overrides applied, "auto" filled and every default written out.
  nlohmann::json resolved;

  static Config from_json(const nlohmann::json& json, const ConfigOptions& options = {});
  // `source` (a file's path, or empty) starts every error, so that it names the file as well as the key.
  static Config from_string(const std::string& text, const ConfigOptions& options = {},
                            const std::string& source = "");
  // A config file's text: what from_file parses (a program that also reads it ahead of the parse, as gpt-train reads
  // the parallel sizes, reads it once with this). ConfigError naming the path when it cannot be opened.
  static std::string read_file(const std::string& path);
  // Errors name the file as well as the key.
  static Config from_file(const std::string& path, const ConfigOptions& options = {});
};

// The model-parallel sizes a config asks for, read ahead of the parse, which needs the data-parallel size they leave
// (world / (tensor x pipeline x sequence): the batch triangle's third side): tensor_parallel.autotp_size,
// pipeline.stages and sequence_parallel_size,
// with `overrides` (--set) applied; 1 where absent or not a whole number ("auto" stages). The parse checks them.
struct ParallelSizes {
  int tensor = 1;
  int pipeline = 1;
  int sequence = 1;  // sequence_parallel_size
};
ParallelSizes read_parallel_sizes(const nlohmann::json& config,
                                    const std::map<std::string, nlohmann::json>& overrides = {});

}  // namespace dscpp
