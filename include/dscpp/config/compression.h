// "compression_training": DeepSpeed Compression's section (ZeroQuant, XTC), parsed and checked here; what it does to a
// model is python/dscpp/compression (modules replaced by compression-aware ones, a schedule stepping with the engine)
// over the quantizers of dscpp/compression/quantize.h. docs/compression.md has each key and what it does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dscpp {

class JsonReader;

// One entry of a technique's "different_groups": the modules it applies to and its own "params".
struct CompressionGroup {
  std::string name;
  // Regular expressions searched (Python's re.search) in the model's module names; a module may belong to one group
  // of a technique only.
  std::vector<std::string> modules;
  // Per entry of `modules`, the modules whose input dimension follows its pruned outputs (the Q/K/V of an attention's
  // output projection): with them redundancy_clean removes the pruned rows/heads/channels, without them it zeroes
  // them. Empty: none given.
  std::vector<std::vector<std::string>> related_modules;
  int start_bits = 0;                 // weight_quantization: the bits training starts at (MoQ steps them down)
  int target_bits = 0;                // weight_quantization: the bits it ends at
  int64_t quantization_period = 1;    // weight_quantization (MoQ): quantize steps until the first bit is dropped
  int bits = 0;                       // activation_quantization: 4 or 8
  double dense_ratio = 1.0;           // pruning: the fraction of weights / rows / heads / channels kept
};

// One technique: its shared parameters and its groups.
struct CompressionTechnique {
  bool enabled = false;
  // Applied training steps (steps the optimizer took; skipped fp16 steps do not count) before it acts; once on, a
  // technique stays on.
  int64_t schedule_offset = 0;
  std::string method;                           // pruning: "l1" or "topk"
  std::string quantization_type = "symmetric";  // quantization: "symmetric" or "asymmetric"
  std::string range_calibration = "dynamic";    // activation_quantization: "dynamic" (per token) or "static"
  int num_heads = 0;                            // head_pruning
  std::vector<CompressionGroup> groups;
};

// "layer_reduction": a student with fewer layers initialised from the teacher's chosen ones.
struct LayerReductionConfig {
  bool enabled = false;
  int64_t keep_number_layer = 0;          // the student's layer count (checked against teacher_layer)
  std::string module_name_prefix;         // the layers' container ("transformer.h", "bert.encoder.layer")
  std::vector<int64_t> teacher_layer;     // teacher layer i -> student layer position
  std::vector<std::string> other_module_name;  // copied whole from the teacher (embeddings, final norm, head)
};

struct CompressionConfig {
  CompressionTechnique weight_quantization, activation_quantization, sparse_pruning, row_pruning, head_pruning,
      channel_pruning;
  // weight_quantization's other shared parameters.
  bool quantize_weight_in_forward = false;  // true: fake-quantized in forward; false: MoQ (weights after each step)
  int64_t quantize_groups = 1;              // groups per weight, each with its own scale
  bool quantize_verbose = false;            // MoQ: log each bit drop
  std::string rounding = "nearest";         // MoQ: "nearest" or "stochastic"
  bool fp16_mixed_quantize = false;         // MoQ: blend the real weight into the quantized one, fading out
  double quantize_change_ratio = 0.001;     // MoQ: how much of the real weight fades per step
  LayerReductionConfig layer_reduction;

  bool any_enabled() const;
};

// Parses and checks the section (JsonReader of "compression_training"); ConfigError naming the key otherwise.
CompressionConfig parse_compression(JsonReader& section);

}  // namespace dscpp
