// The rank side of comm_process_test (defines: run_worker).
#pragma once

#include <string>

namespace dscpp::testing {

// Runs one scenario ("collectives", "peer_dies", "peer_stuck",
// "missing_peer") as the rank the environment names; returns the
// process exit code (0: every check passed, or the expected error was raised).
int run_worker(const std::string& scenario);

}  // namespace dscpp::testing
