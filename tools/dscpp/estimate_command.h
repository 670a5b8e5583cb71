// `dscpp estimate`: DeepSpeed's model-state memory table (estimate_zero2/3_model_states_mem_needs_all_cold).
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>
#include <string>

namespace dscpp {

// Counts and numbers are kept as text and checked in run_estimate, so every bad value is one `error:` line that
// names its flag.
struct EstimateArgs {
  std::string params;                           // required: total params, e.g. 124M, 1.5B, 1.5e9
  std::string largest_layer;                    // "" = not given: no ZeRO-3 table (its GPU term needs it)
  std::string persistent_params = "0";          // ZeRO-3: params kept whole (below the persistence threshold)
  std::string num_gpus = "1";                   // GPUs per node (DeepSpeed's default 1)
  std::string num_nodes = "1";                  // DeepSpeed's default 1
  std::string additional_buffer_factor = "1.5"; // DeepSpeed's default
  bool cpu_offload = false;                     // only the offload_optimizer=cpu rows
};

// Adds the `estimate` subcommand to `app`, filling `args` when it is parsed.
CLI::App* add_estimate_command(CLI::App& app, EstimateArgs& args);

// Prints the table to `out`. Throws std::invalid_argument naming the flag for a missing or out-of-range value.
void run_estimate(const EstimateArgs& args, std::ostream& out);

}  // namespace dscpp
