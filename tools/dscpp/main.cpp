// `dscpp`: the command line. One subcommand per file; this only dispatches and turns errors into one line.
#include <CLI/CLI.hpp>

#include <iostream>

#include "plan_command.h"

int main(int argc, char** argv) {
  CLI::App app{"dscpp: the DeepSpeed training engine in C++"};
  app.require_subcommand(1);
  dscpp::PlanArgs plan_args;
  CLI::App* plan = dscpp::add_plan_command(app, plan_args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (plan->parsed()) dscpp::run_plan(plan_args, std::cout, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
