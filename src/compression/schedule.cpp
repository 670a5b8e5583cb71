// The compression schedule: DeepSpeed's compression/scheduler.py (switches) and runtime/quantize.py (MoQ's bits).
#include "dscpp/compression/schedule.h"

namespace dscpp::compression {

std::string technique_key(Technique t) {
  switch (t) {
    case Technique::kWeightQuantization: return "weight_quantization";
    case Technique::kSparsePruning: return "sparse_pruning";
    case Technique::kRowPruning: return "row_pruning";
    case Technique::kHeadPruning: return "head_pruning";
    case Technique::kChannelPruning: return "channel_pruning";
    case Technique::kActivationQuantization: return "activation_quantization";
  }
  return "";
}

const CompressionTechnique& technique_config(const CompressionConfig& config, Technique t) {
  switch (t) {
    case Technique::kWeightQuantization: return config.weight_quantization;
    case Technique::kSparsePruning: return config.sparse_pruning;
    case Technique::kRowPruning: return config.row_pruning;
    case Technique::kHeadPruning: return config.head_pruning;
    case Technique::kChannelPruning: return config.channel_pruning;
    case Technique::kActivationQuantization: return config.activation_quantization;
  }
  return config.weight_quantization;
}

bool technique_on(const CompressionConfig& config, Technique t, int64_t applied_steps) {
  const CompressionTechnique& c = technique_config(config, t);
  return c.enabled && applied_steps >= c.schedule_offset;
}

bool MoqBits::advance(int64_t quantize_step) {
  if (bits == target || quantize_step < period) return false;
  bits -= 1;
  period *= 2;
  return true;
}

}  // namespace dscpp::compression
