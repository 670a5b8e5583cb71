// `dscpp consolidate`: a checkpoint's whole weights as safetensors (DeepSpeed's zero_to_fp32.py), streaming.
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>
#include <string>

namespace dscpp {

struct ConsolidateArgs {
  std::string checkpoint_dir;           // the save_dir (holding `latest` and the tags)
  std::string out_dir;
  std::string tag;                      // "" = latest
  std::string dtype = "fp32";           // fp32 | bf16 | fp16
  std::string max_shard_size = "5GB";   // HF's default
  std::string format = "native";        // native | hf-gpt2
};

CLI::App* add_consolidate_command(CLI::App& app, ConsolidateArgs& args);

// Writes the weights and prints one line per file to `out`. Throws naming the flag or the checkpoint file.
void run_consolidate(const ConsolidateArgs& args, std::ostream& out);

}  // namespace dscpp
