// `dscpp launch`: the `deepspeed` launcher's command line over dscpp::launcher.
#pragma once

#include <CLI/CLI.hpp>

#include <ostream>

#include "dscpp/launcher/launch.h"

namespace dscpp {

// Adds the `launch` subcommand to `app`, filling `options` when it is parsed. Everything from PROGRAM on is left in
// the subcommand's remaining() arguments, untouched.
CLI::App* add_launch_command(CLI::App& app, launcher::LaunchOptions& options);

// Runs the parsed launch and returns the process exit code: the launch's (see launcher::supervise), or 2 after one
// `error: ...` line on `err` for a usage error (bad hostfile, unknown host, no program, ...).
int run_launch_command(CLI::App& launch, launcher::LaunchOptions& options, std::ostream& err);

}  // namespace dscpp
