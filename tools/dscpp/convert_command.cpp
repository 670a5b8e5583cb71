#include "convert_command.h"

#include <filesystem>

#include "dscpp/checkpoint/deepspeed_checkpoint.h"
#include "dscpp/checkpoint/deepspeed_export.h"

namespace dscpp {

CLI::App* add_convert_command(CLI::App& app, ConvertArgs& args) {
  auto* cmd = app.add_subcommand("convert", "a DeepSpeed checkpoint as ours (--from deepspeed), or ours as "
                                            "DeepSpeed's (--to deepspeed)");
  auto* from = cmd->add_option("--from", args.from, "read this format, write ours")->check(CLI::IsMember({"deepspeed"}));
  auto* to = cmd->add_option("--to", args.to, "read ours, write this format")->check(CLI::IsMember({"deepspeed"}));
  from->excludes(to);
  cmd->add_option("source", args.source, "the save_dir to read (with `latest` and the tags)")->required();
  cmd->add_option("out_dir", args.out_dir, "the checkpoint directory to write")->required();
  cmd->add_option("--tag", args.tag, "tag to convert (default: the one `latest` names)");
  auto* stage = cmd->add_option("--zero_stage", args.zero_stage,
                                "--to deepspeed: write the files DeepSpeed saves at this ZeRO stage, which it loads "
                                "at that stage and world size (default: its universal checkpoint, which it loads at "
                                "ZeRO 1-3 and any world size)")
                     ->check(CLI::Range(0, 3))
                     ->needs(to);
  cmd->add_option("--world_size", args.world_size,
                  "--to deepspeed --zero_stage: the data-parallel world size DeepSpeed continues at (default: the "
                  "saving run's)")
      ->check(CLI::PositiveNumber)
      ->needs(stage);
  return cmd;
}

void run_convert(const ConvertArgs& args, std::ostream& out) {
  const auto written = (std::filesystem::path(args.out_dir) / "").string();
  if (!args.to.empty()) {
    const bool universal = args.zero_stage < 0;
    const auto layout =
        universal ? DeepSpeedLayout::universal() : DeepSpeedLayout::zero(args.zero_stage, args.world_size);
    const auto result = write_deepspeed_checkpoint(args.source, args.tag, args.out_dir, layout);
    const std::string what = universal ? "universal" : "ZeRO-" + std::to_string(args.zero_stage);
    out << written << result.tag << ": DeepSpeed " << what << " checkpoint of " << result.parameters
        << " parameters (" << result.elements << " elements) in " << result.files << " files; ";
    if (universal) {
      out << "load it with \"checkpoint\": {\"load_universal\": true}\n";
    } else if (args.zero_stage == 0) {
      out << "load it without ZeRO\n";
    } else {
      out << "load it at ZeRO " << args.zero_stage << " on " << result.world_size
          << " data-parallel ranks (docs/checkpoints.md: the config settings it assumes)\n";
    }
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
