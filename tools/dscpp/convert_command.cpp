#include "convert_command.h"

#include <filesystem>

#include "dscpp/checkpoint/deepspeed_checkpoint.h"

namespace dscpp {

CLI::App* add_convert_command(CLI::App& app, ConvertArgs& args) {
  auto* cmd = app.add_subcommand("convert", "a DeepSpeed checkpoint as ours, to continue its run here");
  cmd->add_option("--from", args.from, "the source's format")->required()->check(CLI::IsMember({"deepspeed"}));
  cmd->add_option("source", args.source, "DeepSpeed's save_dir (with `latest` and global_stepN/)")->required();
  cmd->add_option("out_dir", args.out_dir, "the checkpoint directory to write (then --load_dir / load_checkpoint)")
      ->required();
  cmd->add_option("--tag", args.tag, "tag to convert (default: the one `latest` names)");
  return cmd;
}

void run_convert(const ConvertArgs& args, std::ostream& out) {
  const auto checkpoint = read_deepspeed_checkpoint(args.source, args.tag);
  const auto& m = checkpoint.manifest;
  int64_t elements = 0;
  for (const auto& p : m.params) elements += p.numel();
  write_whole_checkpoint(checkpoint, args.out_dir);
  out << (std::filesystem::path(args.out_dir) / m.tag).string() << ": DeepSpeed ZeRO-" << m.zero_stage << " "
      << m.compute_dtype << " checkpoint at step " << m.global_steps << ": " << m.params.size() << " parameters ("
      << elements << " elements) with " << m.optimizer << " state, " << m.module_state.size()
      << " buffers and frozen parameters\n";
}

}  // namespace dscpp
