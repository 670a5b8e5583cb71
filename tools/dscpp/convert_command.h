// `dscpp convert --from deepspeed DS_DIR OUT [--tag T]`: a DeepSpeed checkpoint as one of ours
// (dscpp/checkpoint/deepspeed_checkpoint.h), so a run started under DeepSpeed continues under this engine at any
// world size and ZeRO stage. `dscpp convert --to deepspeed OUR_DIR OUT [--tag T]`: one of ours as DeepSpeed's
// universal checkpoint, or with `--zero_stage 0` its ZeRO-0 layout (dscpp/checkpoint/deepspeed_export.h), so real
// DeepSpeed continues it.
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>
#include <string>

namespace dscpp {

struct ConvertArgs {
  std::string from;     // "deepspeed": read DeepSpeed's, write ours
  std::string to;       // "deepspeed": read ours, write DeepSpeed's universal checkpoint
  std::string source;   // the save_dir to read (holding `latest` and the tags)
  std::string out_dir;  // the save_dir to write (the same tag, and `latest`)
  std::string tag;      // "" = the tag the source's `latest` names
  int zero_stage = -1;  // --to deepspeed: 0 writes DeepSpeed's ZeRO-0 layout; unset, its universal checkpoint
};

CLI::App* add_convert_command(CLI::App& app, ConvertArgs& args);

// Converts and prints what it wrote to `out`. Throws CheckpointError naming the file and the problem.
void run_convert(const ConvertArgs& args, std::ostream& out);

}  // namespace dscpp
