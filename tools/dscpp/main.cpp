// `dscpp`: the command line. One subcommand per file; this only dispatches and turns errors into one line.
#include <CLI/CLI.hpp>

#include <iostream>

#include "consolidate_command.h"
#include "convert_command.h"
#include "estimate_command.h"
#include "launch_command.h"
#include "plan_command.h"
#include "plot_command.h"
#include "report_command.h"

int main(int argc, char** argv) {
  CLI::App app{"dscpp: the DeepSpeed training engine in C++"};
  app.require_subcommand(1);
  dscpp::PlanArgs plan_args;
  CLI::App* plan = dscpp::add_plan_command(app, plan_args);
  dscpp::launcher::LaunchOptions launch_options;
  CLI::App* launch = dscpp::add_launch_command(app, launch_options);
  dscpp::EstimateArgs estimate_args;
  CLI::App* estimate = dscpp::add_estimate_command(app, estimate_args);
  dscpp::ConsolidateArgs consolidate_args;
  CLI::App* consolidate = dscpp::add_consolidate_command(app, consolidate_args);
  dscpp::ConvertArgs convert_args;
  CLI::App* convert = dscpp::add_convert_command(app, convert_args);
  CLI::App* report = dscpp::add_report_command(app);
  dscpp::PlotArgs plot_args;
  CLI::App* plot = dscpp::add_plot_command(app, plot_args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // launch reports its own errors: it must return the ranks' exit code, and 2 for a usage error.
  if (launch->parsed()) return dscpp::run_launch_command(*launch, launch_options, std::cerr);
  try {
    if (plan->parsed()) dscpp::run_plan(plan_args, std::cout, std::cerr);
    if (estimate->parsed()) dscpp::run_estimate(estimate_args, std::cout);
    if (consolidate->parsed()) dscpp::run_consolidate(consolidate_args, std::cout);
    if (convert->parsed()) dscpp::run_convert(convert_args, std::cout);
    if (report->parsed()) dscpp::run_report(std::cout);
    if (plot->parsed()) dscpp::run_plot(plot_args, std::cout, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
