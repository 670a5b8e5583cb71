// gpt-train's compression set-up: refusals first (each naming why), then ModelCompression over the model.
#include "model/compression.h"

#include <stdexcept>

namespace gpt {

std::shared_ptr<dscpp::compression::ModelCompression> compress(Gpt& model, const dscpp::Config& config,
                                                               const CompressionRun& run,
                                                               std::function<void(const std::string&)> log) {
  const dscpp::CompressionConfig& c = config.compression;
  if (!c.any_enabled()) return nullptr;
  if (run.pipeline || run.sequence_parallel || run.partitioned) {
    const char* what = run.pipeline            ? "pipeline parallelism"
                       : run.sequence_parallel ? "sequence parallelism"
                                               : "ZeRO-3's partitioned build (use --zero_init false)";
    throw std::invalid_argument(std::string("compression_training with ") + what + " is not supported yet by gpt-train");
  }
  if (run.init_from) {  // the masks would come from the random init, and HF has no scores to load
    throw std::invalid_argument("compression_training with --init_from is not supported yet by gpt-train (the l1 "
                                "masks are made from the weights the model starts with)");
  }
  if (c.weight_quantization.enabled && !c.quantize_weight_in_forward &&
      (config.compute_dtype() == dscpp::DType::kFloat32 || config.zero.stage == 3)) {
    throw dscpp::ConfigError(
        "compression_training.weight_quantization.shared_parameters.quantize_weight_in_forward = false (MoQ: weights "
        "quantized in place after each step) needs fp16 or bf16 (the fp32 master apart from the weights) and ZeRO "
        "0-2 (whole weights in the model); set it true to quantize in the forward");
  }
  if (run.activation_checkpointing && c.activation_quantization.enabled &&
      c.activation_quantization.range_calibration == "static") {
    throw std::invalid_argument("compression_training.activation_quantization.shared_parameters.range_calibration = "
                                "\"static\" with --activation_checkpointing: the recompute would move the running "
                                "range a second time; use dynamic, or no activation checkpointing");
  }
  // Sliced over --tensor_parallel, each layer compresses as its whole layer: the run equals one process's.
  const dscpp::compression::TensorParallelLayout tensor_parallel{model->model_group(), model->tensor_parallel_slices()};
  auto compression = std::make_shared<dscpp::compression::ModelCompression>(c, *model, std::move(log), tensor_parallel);
  model->attach_compression(*compression);
  return compression;
}

}  // namespace gpt
