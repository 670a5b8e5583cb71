// `dscpp consolidate CKPT_DIR OUT [--tag T] [--dtype fp32|bf16|fp16] [--max_shard_size 5GB] [--format F]`
//: see dscpp/checkpoint/consolidate.h for what it writes and how little memory it needs.
#include "consolidate_command.h"

#include <chrono>

#include "dscpp/checkpoint/consolidate.h"
#include "dscpp/monitor/step_log.h"

namespace dscpp {

CLI::App* add_consolidate_command(CLI::App& app, ConsolidateArgs& args) {
  auto* cmd = app.add_subcommand("consolidate", "write a checkpoint's whole weights as safetensors (zero_to_fp32)");
  cmd->add_option("checkpoint_dir", args.checkpoint_dir, "the save_dir (with `latest` and the tag directories)")
      ->required();
  cmd->add_option("out_dir", args.out_dir, "directory for model.safetensors (or its shards and index)")->required();
  cmd->add_option("--tag", args.tag, "tag to read (default: the one `latest` names)");
  cmd->add_option("--dtype", args.dtype, "fp32 (the master weights), bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_option("--max_shard_size", args.max_shard_size, "largest output file, e.g. 5GB, 500MB, 2GiB");
  cmd->add_option("--format", args.format, "native (the model's names) or hf-gpt2 (HF GPT-2: Conv1D, config.json)")
      ->check(CLI::IsMember({"native", "hf-gpt2"}));
  return cmd;
}

void run_consolidate(const ConsolidateArgs& args, std::ostream& out) {
  ConsolidateOptions options;
  options.tag = args.tag;
  options.dtype = args.dtype == "bf16" ? torch::kBFloat16 : args.dtype == "fp16" ? torch::kFloat16 : torch::kFloat32;
  try {
    options.max_shard_bytes = parse_byte_size(args.max_shard_size);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--max_shard_size: ") + e.what());
  }
  options.format = args.format == "hf-gpt2" ? WeightsFormat::kHfGpt2 : WeightsFormat::kNative;
  const auto start = std::chrono::steady_clock::now();
  const auto result = consolidate(args.checkpoint_dir, args.out_dir, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& file : result.files) out << args.out_dir << "/" << file << "\n";
  out << "consolidated tag " << result.tag << ": " << result.total_bytes << " bytes of " << args.dtype
      << " weights in " << seconds << " s; largest tensor " << result.largest_tensor_bytes << " bytes; peak RSS "
      << peak_resident_bytes() << " bytes\n";
}

}  // namespace dscpp
