// The HF-style flags and how they fill "auto" (see auto_flags.h).
#include "auto_flags.h"

#include <algorithm>

namespace gpt {

void add_auto_flags(CLI::App& app, AutoFlags& flags) {
  app.add_option("--lr", flags.lr, "fills \"auto\": optimizer.params.lr and warmup_max_lr (default 1e-3)");
  app.add_option("--weight_decay", flags.weight_decay, "fills \"auto\": optimizer.params.weight_decay (default 0.1)");
  app.add_option("--clip", flags.clip, "fills \"auto\": gradient_clipping (default 1.0)");
  app.add_option("--micro_batch", flags.micro_batch,
                 "fills \"auto\": train_micro_batch_size_per_gpu (default 8 where the config's batch numbers leave "
                 "it free)")
      ->check(CLI::PositiveNumber);
  app.add_option("--grad_accum", flags.grad_accum, "fills \"auto\": gradient_accumulation_steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup_steps", flags.warmup_steps,
                 "fills \"auto\": scheduler warmup_num_steps (default: a tenth of --steps)");
  app.add_option("--total_steps", flags.total_steps,
                 "fills \"auto\": scheduler total_num_steps (default: --steps, at least 3)");
  app.add_flag("--bf16", flags.bf16, "fills \"auto\": bf16.enabled true, fp16.enabled false");
  app.add_flag("--fp16", flags.fp16, "fills \"auto\": fp16.enabled true, bf16.enabled false");
}

dscpp::AutoValues auto_values(const AutoFlags& flags, int64_t steps, std::optional<int64_t> hidden_size) {
  dscpp::AutoValues::HfArgs hf;
  hf.lr = flags.lr;
  hf.weight_decay = flags.weight_decay;
  hf.max_grad_norm = flags.clip;
  hf.micro_batch = flags.micro_batch;
  hf.default_micro_batch = kDefaultMicroBatch;
  hf.grad_accum = flags.grad_accum;
  hf.warmup_steps = flags.warmup_steps.value_or(std::max<int64_t>(1, steps / 10));
  // WarmupCosineLR needs total > max(2, warmup): very short runs get a schedule that would end a little later.
  hf.total_steps = flags.total_steps.value_or(std::max<int64_t>(steps, 3));
  hf.hidden_size = hidden_size;
  hf.bf16 = flags.bf16;
  hf.fp16 = flags.fp16;
  return dscpp::AutoValues::from_hf_args(hf);
}

}  // namespace gpt
