// `dscpp plan`: a dry run of a DeepSpeed config — resolved JSON, batch triangle, memory per stage, LR schedule.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "auto_flags.h"

namespace dscpp {

struct PlanArgs {
  std::string config_path;
  int world_size = 1;  // ranks in the job; the data-parallel size is this / (pipeline stages x tensor-parallel size)
  std::string params;                    // "" = no memory table; else e.g. 124M, 1.5B, 1.5e9
  std::string model;                     // or one of gpt-train's presets (tiny … gpt2-xl): its parameter count
  std::vector<std::string> sets;         // "key=value", value parsed as JSON when it is JSON
  std::string schedule_csv;              // "" = none
  int64_t steps = gpt::kDefaultSteps;    // gpt-train's --steps: fills the schedule's "auto"; rows of the CSV
  // gpt-train's HF-style flags, filling "auto" exactly as gpt-train does.
  gpt::AutoFlags autos;
  std::optional<int64_t> hidden_size;    // fills the bucket sizes' "auto" (--model gives its width)
  // gpt-train's MoE flags, with --model: its MoE blocks, and the experts spread over ep_size ranks.
  int64_t moe_experts = 0;
  int ep_size = 1;
};

// Adds the `plan` subcommand to `app`, filling `args` when it is parsed.
CLI::App* add_plan_command(CLI::App& app, PlanArgs& args);

// Runs the plan: prints to `out`, warnings to `err`. Throws on an invalid config or arguments.
void run_plan(const PlanArgs& args, std::ostream& out, std::ostream& err);

}  // namespace dscpp
