// `dscpp plot RUN.jsonl -o loss.svg`: loss, lr and throughput over the steps of a gpt-train --metrics file, as one
// standalone SVG (three panels sharing the step axis; no plotting library).
#pragma once

#include <CLI/CLI.hpp>

#include <istream>
#include <ostream>
#include <string>

namespace dscpp {

struct PlotArgs {
  std::string metrics;           // the JSONL file
  std::string output = "loss.svg";
  std::string title;             // default: the metrics file's name
};

CLI::App* add_plot_command(CLI::App& app, PlotArgs& args);

struct PlotSummary {
  int steps = 0;             // lines with a step
  int skipped_values = 0;    // non-finite values left out (NaN/inf loss of an overflowed step)
};

// The SVG for the metrics in `jsonl` (`source` names it in errors: "FILE:LINE: ..."). Throws std::invalid_argument
// for a line that is not a JSON object, or when no line has a step.
std::string render_plot(std::istream& jsonl, const std::string& source, const std::string& title,
                        PlotSummary& summary);

// Reads args.metrics, writes args.output, prints "wrote <output> (N steps)" to `out` and a note about skipped
// values to `err`. Throws std::runtime_error naming a file that cannot be read or written.
void run_plot(const PlotArgs& args, std::ostream& out, std::ostream& err);

}  // namespace dscpp
