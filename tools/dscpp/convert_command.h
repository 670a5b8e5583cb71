// `dscpp convert --from deepspeed DS_DIR OUT [--tag T]`: a DeepSpeed checkpoint as one of ours
// (dscpp/checkpoint/deepspeed_checkpoint.h), so a run started under DeepSpeed continues under this engine at any
// world size and ZeRO stage. `dscpp convert --to deepspeed OUR_DIR OUT [--tag T] [--zero_stage S [--world_size W]]`:
// one of ours as DeepSpeed's universal checkpoint, or as the files DeepSpeed saves at ZeRO S on W data-parallel
// ranks (dscpp/checkpoint/deepspeed_export.h), so real DeepSpeed continues it.
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
  int zero_stage = -1;  // --to deepspeed: DeepSpeed's files of this ZeRO stage (0-3); unset, its universal checkpoint
  int world_size = 0;   // --to deepspeed --zero_stage: for this many data-parallel ranks; 0, the saving run's
};

CLI::App* add_convert_command(CLI::App& app, ConvertArgs& args);

// Converts and prints what it wrote to `out`. Throws CheckpointError naming the file and the problem.
void run_convert(const ConvertArgs& args, std::ostream& out);

}  // namespace dscpp
