// gpt-train's DeepSpeed Compression: the config's compression_training applied to the GPT's block layers
// (dscpp::compression::ModelCompression), after the checks of what gpt-train cannot compress yet.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dscpp/compression/linear_compression.h"
#include "dscpp/config/config.h"
#include "model/gpt.h"

namespace gpt {

// How the run is laid out, as far as compression cares.
struct CompressionRun {
  bool pipeline = false, sequence_parallel = false, partitioned = false;  // ZeRO-3's partitioned build
  bool init_from = false, activation_checkpointing = false;
};

// The model's compression (attached to its layers, masks and scores registered on them), or nullptr when the config
// switches nothing on. Set up from the whole weights, as Python's init_compression, before the engine is built.
// std::invalid_argument / dscpp::ConfigError naming what is not supported with this run.
std::shared_ptr<dscpp::compression::ModelCompression> compress(Gpt& model, const dscpp::Config& config,
                                                               const CompressionRun& run,
                                                               std::function<void(const std::string&)> log);

}  // namespace gpt
