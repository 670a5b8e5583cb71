// When DeepSpeed Compression's techniques act: each switches on once the applied optimizer steps reach its
// schedule_offset and stays on; MoQ lowers a weight's bits one at a time on its own period. One definition for both
// front ends: Python's dscpp.compression.scheduler and gpt-train's compressed layers ask these.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "dscpp/config/compression.h"

namespace dscpp::compression {

enum class Technique {
  kWeightQuantization,
  kSparsePruning,
  kRowPruning,
  kHeadPruning,
  kChannelPruning,
  kActivationQuantization,
};
// In the order redundancy_clean makes them permanent (DeepSpeed's): quantized values first, then masks over them.
inline constexpr std::array<Technique, 6> kTechniques = {
    Technique::kWeightQuantization, Technique::kSparsePruning,  Technique::kRowPruning,
    Technique::kHeadPruning,        Technique::kChannelPruning, Technique::kActivationQuantization};

// The config key: "weight_quantization", "sparse_pruning", ...
std::string technique_key(Technique t);
const CompressionTechnique& technique_config(const CompressionConfig& config, Technique t);

// Whether `t` acts after `applied_steps` applied optimizer steps (skipped fp16 steps do not count): switched on in the
// config and its schedule_offset reached.
bool technique_on(const CompressionConfig& config, Technique t, int64_t applied_steps);

// MoQ's bits of one weight (DeepSpeed's runtime/quantize.py): at quantize call `quantize_step` (counted from 1), a
// weight above its target drops one bit once the step reaches its period, which then doubles.
struct MoqBits {
  int bits = 8;
  int target = 8;
  int64_t period = 1;

  // Advances to `quantize_step`; true when a bit was dropped.
  bool advance(int64_t quantize_step);
};

}  // namespace dscpp::compression
