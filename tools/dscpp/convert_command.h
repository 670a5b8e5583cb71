// `dscpp convert --from deepspeed DS_DIR OUT [--tag T]`: a DeepSpeed checkpoint as one of ours
// (dscpp/checkpoint/deepspeed_checkpoint.h), so a run started under DeepSpeed continues under this engine at any
// world size and ZeRO stage.
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>
#include <string>

namespace dscpp {

struct ConvertArgs {
  std::string from;     // "deepspeed"
  std::string source;   // DeepSpeed's save_dir (holding `latest` and global_stepN/)
  std::string out_dir;  // our save_dir to write (the same tag, and `latest`)
  std::string tag;      // "" = the tag DeepSpeed's `latest` names
};

CLI::App* add_convert_command(CLI::App& app, ConvertArgs& args);

// Converts and prints what it wrote to `out`. Throws CheckpointError naming the file and the problem.
void run_convert(const ConvertArgs& args, std::ostream& out);

}  // namespace dscpp
