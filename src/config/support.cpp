// check_supported: every config this engine cannot run stops here, at parse time, naming the key.
#include "dscpp/config/support.h"

#include <variant>

namespace dscpp {
namespace {

[[noreturn]] void reject(const std::string& key, const std::string& what) {
  throw ConfigError(key + ": " + what + " is not supported yet by deepspeed.cpp");
}

// What the optimizers need of the rest of the config, refused as DeepSpeed refuses it, or where not built yet.
void check_optimizer(const Config& config) {
  const auto& options = config.optimizer->options;
  const std::string type = "optimizer.type: \"" + config.optimizer->type + "\"";
  const bool lamb = std::holds_alternative<LambOptions>(options);
  const bool onebit_lamb = std::holds_alternative<OneBitLambOptions>(options);
  if ((lamb || onebit_lamb) && config.fp16.scaler.static_scale > 0) {
    throw ConfigError(type + " requires dynamic loss scaling, as DeepSpeed's does: fp16.loss_scale must be 0");
  }
  if (lamb && config.zero.offload_optimizer.device != OffloadDevice::kNone) {
    // Offload steps the partition slice by slice; the trust ratio needs each tensor's norms before any moves.
    reject("zero_optimization.offload_optimizer", "Lamb with an offloaded optimizer");
  }
  if (config.zero.stage != 0 && (onebit_lamb || std::holds_alternative<OneBitAdamOptions>(options) ||
                                 std::holds_alternative<ZeroOneAdamOptions>(options))) {
    // Their momentum is averaged whole on every rank, which a partitioned optimizer state would not have.
    const char* name = onebit_lamb ? "1-bit LAMB" : std::holds_alternative<ZeroOneAdamOptions>(options) ? "0/1 Adam"
                                                                                                     : "1-bit Adam";
    throw ConfigError(type + " at zero_optimization.stage " + std::to_string(config.zero.stage) + ": " + name +
                      " is not compatible with ZeRO (DeepSpeed refuses it too); use stage 0");
  }
}

}  // namespace

DType gradient_accumulation_dtype(const Config& config) {
  if (config.zero.stage < 2) return config.compute_dtype();
  if (config.zero.offload_optimizer.device != OffloadDevice::kNone) return DType::kFloat32;
  // Sequence parallelism replaces the gradients' wire dtype, and so what stages 2-3 accumulate in (stage_context).
  if (config.sequence_parallel_size > 1) return config.seq_parallel_communication_data_type;
  return config.communication_data_type.value_or(config.compute_dtype());
}

void check_supported(const Config& config) {
  const auto& offload = config.zero.offload_optimizer;
  if (offload.device != OffloadDevice::kNone && config.zero.stage == 0) {
    throw ConfigError(std::string("zero_optimization.offload_optimizer.device is \"") +
                      (offload.device == OffloadDevice::kCpu ? "cpu" : "nvme") +
                      "\" at stage 0: offloading moves each rank's optimizer partition off the device, so it needs "
                      "zero_optimization.stage 1, 2 or 3");
  }
  if (offload.device != OffloadDevice::kNone && offload.ratio != 1.0) {
    reject("zero_optimization.offload_optimizer.ratio", "a value other than 1 (partial offload)");
  }
  if (config.fp16.auto_cast) reject("fp16.auto_cast", "true");
  if (config.wandb.enabled) reject("wandb.enabled", "the wandb monitor");
  if (config.zero.round_robin_gradients) reject("zero_optimization.round_robin_gradients", "true");
  if (config.optimizer) check_optimizer(config);
  // Sequence parallelism splits the data-parallel group's consecutive ranks; the layouts that cut that group their own
  // way, and the optimizers that average their own state over it, are not combined with it yet.
  if (const int sp = config.sequence_parallel_size; sp > 1) {
    const std::string key = "sequence_parallel_size " + std::to_string(sp);
    if (config.tensor_parallel_size > 1) {
      throw ConfigError(key + " with tensor_parallel.autotp_size " + std::to_string(config.tensor_parallel_size) +
                        ": sequence and tensor parallelism together are not supported yet by deepspeed.cpp");
    }
    if (config.pipeline.stages > 1) {
      throw ConfigError(key + " with pipeline.stages " + std::to_string(config.pipeline.stages) +
                        ": sequence and pipeline parallelism together are not supported yet by deepspeed.cpp");
    }
    if (config.optimizer && (std::holds_alternative<OneBitAdamOptions>(config.optimizer->options) ||
                             std::holds_alternative<ZeroOneAdamOptions>(config.optimizer->options) ||
                             std::holds_alternative<OneBitLambOptions>(config.optimizer->options))) {
      throw ConfigError(key + " with optimizer.type \"" + config.optimizer->type + "\": the 1-bit optimizers "
                        "average their momentum over every rank of the data-parallel group; not supported yet");
    }
  }
  if (config.grad_accum_dtype && *config.grad_accum_dtype != gradient_accumulation_dtype(config)) {
    reject("data_types.grad_accum_dtype",
           "\"" + to_string(*config.grad_accum_dtype) + "\" at stage " + std::to_string(config.zero.stage) +
               " with " + to_string(config.compute_dtype()) + " compute (this config accumulates gradients in " +
               to_string(gradient_accumulation_dtype(config)) + "; set that or remove the key)");
  }
  // checkpoint.load_universal needs nothing: every checkpoint here loads on any world size and stage.
}

}  // namespace dscpp
