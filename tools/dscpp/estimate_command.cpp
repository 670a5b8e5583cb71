// `dscpp estimate`: per-GPU and per-CPU model-state memory for ZeRO-2 and ZeRO-3 and each offload
// choice, from a parameter count alone, laid out as DeepSpeed's `..._all_cold` estimators print it.
#include "estimate_command.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "count_arg.h"
#include "dscpp/zero/memory_estimate.h"

namespace dscpp {
namespace {

int64_t parse_positive_count(const std::string& flag, const std::string& text) {
  int64_t count = 0;
  try {
    count = parse_count(text);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(flag + ": " + e.what());
  }
  if (count <= 0) throw std::invalid_argument(flag + " " + text + ": must be > 0");
  return count;
}

int parse_positive_int(const std::string& flag, const std::string& text) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < 1 || value > 1'000'000) {
    throw std::invalid_argument(flag + " '" + text + "': must be a whole number in 1..1000000");
  }
  return static_cast<int>(value);
}

double parse_positive_double(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(value) || value <= 0) {
    throw std::invalid_argument(flag + " '" + text + "': must be a number > 0");
  }
  return value;
}

// DeepSpeed's row: f" {cpu_mem/2**30:7.2f}GB | {gpu_mem/2**30:6.2f}GB | {options}".
void print_row(std::ostream& out, const ZeroEstimateRow& row, const std::string& options) {
  constexpr double kGiB = 1073741824.0;
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), " %7.2fGB | %6.2fGB | ", static_cast<double>(row.cpu_bytes) / kGiB,
                static_cast<double>(row.gpu_bytes) / kGiB);
  out << buffer << options << "\n";
}

// "cpu " is padded to the width of "none" so that the option columns line up, as in DeepSpeed.
const char* device_name(bool offloaded) { return offloaded ? "cpu " : "none"; }

}  // namespace

CLI::App* add_estimate_command(CLI::App& app, EstimateArgs& args) {
  CLI::App* estimate =
      app.add_subcommand("estimate", "Model-state memory per GPU and per node's CPU for ZeRO-2/3 and each offload "
                                     "choice (DeepSpeed's estimate_zero2/3_model_states_mem_needs)");
  estimate->add_option("--params", args.params, "total model params (required), e.g. 124M, 1.5B, 1.5e9");
  estimate->add_option("--largest_layer", args.largest_layer,
                       "params of the largest layer (module's own params), e.g. 32M; needed for the ZeRO-3 table");
  estimate->add_option("--persistent_params", args.persistent_params,
                       "ZeRO-3: params below stage3_param_persistence_threshold, kept whole on every GPU in 16 bits "
                       "(+2P bytes per GPU; default 0, as DeepSpeed's table)");
  estimate->add_option("--num_gpus,--num_gpus_per_node", args.num_gpus, "GPUs per node (default 1)");
  estimate->add_option("--num_nodes", args.num_nodes, "nodes (default 1)");
  estimate->add_option("--additional_buffer_factor", args.additional_buffer_factor,
                       "multiplier on the CPU side for buffers (default 1.5)");
  estimate->add_flag("--cpu_offload", args.cpu_offload, "show only the rows with offload_optimizer=cpu");
  return estimate;
}

void run_estimate(const EstimateArgs& args, std::ostream& out) {
  if (args.params.empty()) throw std::invalid_argument("--params is required, e.g. --params 1.5B");
  ZeroEstimateSetup setup;
  setup.total_params = parse_positive_count("--params", args.params);
  const bool has_largest = !args.largest_layer.empty();
  if (has_largest) {
    setup.largest_layer_params = parse_positive_count("--largest_layer", args.largest_layer);
    if (setup.largest_layer_params > setup.total_params) {
      throw std::invalid_argument("--largest_layer " + args.largest_layer + " (" +
                                  std::to_string(setup.largest_layer_params) + ") exceeds --params " + args.params +
                                  " (" + std::to_string(setup.total_params) + ")");
    }
  }
  if (args.persistent_params != "0") {
    setup.persistent_params = parse_positive_count("--persistent_params", args.persistent_params);
    if (setup.persistent_params > setup.total_params) {
      throw std::invalid_argument("--persistent_params " + args.persistent_params + " (" +
                                  std::to_string(setup.persistent_params) + ") exceeds --params " + args.params +
                                  " (" + std::to_string(setup.total_params) + ")");
    }
  }
  setup.num_gpus_per_node = parse_positive_int("--num_gpus", args.num_gpus);
  setup.num_nodes = parse_positive_int("--num_nodes", args.num_nodes);
  setup.additional_buffer_factor =
      parse_positive_double("--additional_buffer_factor", args.additional_buffer_factor);
  try {
    validate(setup);  // what is left: the 64-bit overflow bound
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("--params ") + args.params + ": " + e.what());
  }

  // DeepSpeed's header, then one block per stage (its two functions print one each).
  out << "Estimated memory needed for params, optim states and gradients for a:\n"
      << "HW: Setup with " << setup.num_nodes << (setup.num_nodes > 1 ? " nodes, " : " node, ")
      << setup.num_gpus_per_node << (setup.num_gpus_per_node > 1 ? " GPUs" : " GPU") << " per node.\n"
      << "SW: Model with " << static_cast<int64_t>(static_cast<double>(setup.total_params) / 1e6)
      << "M total params";
  if (has_largest) {
    out << ", " << static_cast<int64_t>(static_cast<double>(setup.largest_layer_params) / 1e6)
        << "M largest layer params";
  }
  if (setup.persistent_params > 0) {
    out << ", " << setup.persistent_params << " persistent params (ZeRO-3 per GPU +" << 2 * setup.persistent_params
        << " bytes)";
  }
  out << ".\n";

  out << "\nZeRO-2:\n  per CPU  |  per GPU |   Options\n";
  for (const ZeroEstimateRow& row : estimate_zero2_rows(setup)) {
    if (args.cpu_offload && !row.offload_optimizer) continue;
    print_row(out, row, std::string("offload_optimizer=") + device_name(row.offload_optimizer));
  }

  out << "\nZeRO-3:\n";
  if (!has_largest) {
    out << "  (pass --largest_layer L: every GPU holds the gathered largest layer, 4L bytes)\n";
  } else {
    out << "  per CPU  |  per GPU |   Options\n";
    for (const ZeroEstimateRow& row : estimate_zero3_rows(setup)) {
      if (args.cpu_offload && !row.offload_optimizer) continue;
      print_row(out, row, std::string("offload_param=") + device_name(row.offload_param) +
                              ", offload_optimizer=" + device_name(row.offload_optimizer) +
                              ", zero_init=" + (row.zero_init ? "1" : "0"));
    }
  }
  char factor[32];
  std::snprintf(factor, sizeof(factor), "%g", setup.additional_buffer_factor);
  out << "\nper CPU: one node's host memory (x additional_buffer_factor " << factor
      << "); per GPU: params, grads and Adam state only (no activations, no communication buffers).\n";
}

}  // namespace dscpp
