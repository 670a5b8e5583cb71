// Kill points for crash testing: named moments at which a test can make a rank die as a machine fault would kill it
// (SIGKILL: no destructor, no flush, no message), so that tests/chaos and the killed-save tests can show what a job
// and its checkpoints look like afterwards.
//
//   DSCPP_KILL_AT=POINT[@N][,rank=R][,restart=K]
//
// kills the process the N-th time (default 1, counted from 1) it reaches POINT, on global rank R only (default every
// rank; the rank is $RANK), and only in the start numbered K of a job that `dscpp launch --max_restarts` restarts
// (default 0, the first: $TORCHELASTIC_RESTART_COUNT, unset = 0) — so the restarted job runs through. The points are
// kKillPoints below. Unset, a point costs one load of a flag.
#pragma once

#include <string>
#include <vector>

namespace dscpp::fault {

// Every point the engine passes, in the order of a training step and a save.
inline const std::vector<std::string> kKillPoints = {
    "engine.forward",   // Engine::forward, before the loss function runs
    "engine.backward",  // Engine::backward, before autograd runs (gradient hooks reduce during it)
    "engine.step",      // Engine::step, before the optimizer step (and its gradient-norm collectives)
    "comm.collective",  // every collective and send/recv of the comm interface, before it is issued
    "swap.io",          // every NVMe read or write submitted by the swap layer
    // A checkpoint save, in its protocol's order (docs/checkpoint-format.md):
    "checkpoint.shard_half_written", "checkpoint.shard_written", "checkpoint.manifest_written",
    "checkpoint.published"};

// DSCPP_KILL_AT's text, parsed. Throws std::invalid_argument naming the variable and what is allowed for an unknown
// point or a malformed field.
struct KillRule {
  std::string point;
  long long hit = 1;
  int rank = -1;  // -1: every rank
  int restart = 0;
};
KillRule parse_kill_rule(const std::string& text);

// SIGKILLs this process when DSCPP_KILL_AT's rule matches `point` (one of kKillPoints) here and now.
void kill_point(const char* point);

}  // namespace dscpp::fault
