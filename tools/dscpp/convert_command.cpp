#include "convert_command.h"

#include <filesystem>

#include "dscpp/checkpoint/deepspeed_checkpoint.h"
#include "dscpp/checkpoint/deepspeed_export.h"

namespace dscpp {

CLI::App* add_convert_command(CLI::App& app, ConvertArgs& args) {
  auto* cmd = app.add_subcommand("convert", "a DeepSpeed checkpoint as ours (--from deepspeed), or ours as "
                                            "DeepSpeed's universal checkpoint (--to deepspeed)");
  auto* from = cmd->add_option("--from", args.from, "read this format, write ours")->check(CLI::IsMember({"deepspeed"}));
  auto* to = cmd->add_option("--to", args.to, "read ours, write this format")->check(CLI::IsMember({"deepspeed"}));
  from->excludes(to);
  cmd->add_option("source", args.source, "the save_dir to read (with `latest` and the tags)")->required();
  cmd->add_option("out_dir", args.out_dir, "the checkpoint directory to write")->required();
  cmd->add_option("--tag", args.tag, "tag to convert (default: the one `latest` names)");
  cmd->add_option("--zero_stage", args.zero_stage,
                  "--to deepspeed: 0 writes DeepSpeed's ZeRO-0 layout (default: its universal checkpoint, which "
                  "DeepSpeed loads at ZeRO 1-3)")
      ->check(CLI::IsMember({0}))
      ->needs(to);
  return cmd;
}

void run_convert(const ConvertArgs& args, std::ostream& out) {
  const auto written = (std::filesystem::path(args.out_dir) / "").string();
  if (!args.to.empty()) {
    const bool zero0 = args.zero_stage == 0;
    const auto result = write_deepspeed_checkpoint(args.source, args.tag, args.out_dir,
                                                   zero0 ? DeepSpeedLayout::kZero0 : DeepSpeedLayout::kUniversal);
    out << written << result.tag << ": DeepSpeed " << (zero0 ? "ZeRO-0" : "universal") << " checkpoint of "
        << result.parameters << " parameters (" << result.elements << " elements)"
        << (zero0 ? "; load it without ZeRO\n" : "; load it with \"checkpoint\": {\"load_universal\": true}\n");
    return;
  }
  if (args.from.empty()) throw std::invalid_argument("convert: name the direction, --from deepspeed or --to deepspeed");
  const auto checkpoint = read_deepspeed_checkpoint(args.source, args.tag);
  const auto& m = checkpoint.manifest;
  int64_t elements = 0;
  for (const auto& p : m.params) elements += p.numel();
  write_whole_checkpoint(checkpoint, args.out_dir);
  out << written << m.tag << ": DeepSpeed ZeRO-" << m.zero_stage << " " << m.compute_dtype << " checkpoint at step "
      << m.global_steps << ": " << m.params.size() << " parameters (" << elements << " elements) with "
      << m.optimizer << " state, " << m.module_state.size() << " buffers and frozen parameters\n";
}

}  // namespace dscpp
