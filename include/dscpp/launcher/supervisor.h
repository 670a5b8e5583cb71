// Starts a launch's child processes and watches them: the first child to fail (non-zero exit or a signal) takes
// the others down — SIGTERM, then SIGKILL after a grace period — and its code becomes the launcher's. Ctrl-C and
// SIGTERM to the launcher are forwarded. Each child leads its own process group so signals reach grandchildren.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "dscpp/launcher/world.h"

namespace dscpp::launcher {

struct ChildSpec {
  std::string name;               // "rank 3", "node 1 (worker-1)": used in messages
  std::vector<std::string> argv;  // argv[0] is searched on PATH when it has no '/'
  EnvMap env;                     // the child's complete environment
  std::string log_path;           // "" = inherit the launcher's stdout/stderr; else both go to this file (truncated)
  std::vector<int> cpus;          // CPU ids to pin the child to; empty = inherit the launcher's affinity
  // true: stdin is a pipe the launcher holds open until it exits, so the child sees EOF if the launcher dies (an ssh
  // child forwards that EOF to the remote launcher, which then stops its ranks). false: stdin is /dev/null.
  bool stdin_pipe = false;
};

struct SupervisorOptions {
  std::string others = "ranks";   // what the children are, in "terminating the other ranks"
  double grace_seconds = 5.0;     // between SIGTERM and SIGKILL when tearing down
  bool watch_stdin = false;       // EOF on the launcher's own stdin acts like SIGTERM (a launcher started by ssh)
};

// How a supervised run ended. `exit_code`: 0 when every child exited 0; else the first failure's code (128+N for
// signal N); 128+N when the launcher itself got signal N. `stopped` is true when the launcher was told to stop (a
// signal, or EOF on a watched stdin) rather than a child failing: a launch that restarts failed ranks must not
// restart then.
struct SupervisionResult {
  int exit_code = 0;
  bool stopped = false;
};

// Runs `children` to completion. Messages go to `err`. Throws std::runtime_error when a child cannot be started (the
// ones already started are killed and reaped first). Blocks SIGCHLD/SIGINT/SIGTERM/SIGHUP in the calling thread
// while it runs; call it from a single-threaded process.
SupervisionResult supervise(const std::vector<ChildSpec>& children, const SupervisorOptions& options,
                            std::ostream& err);

}  // namespace dscpp::launcher
