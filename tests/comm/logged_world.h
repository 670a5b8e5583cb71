// A rank of a multi-process comm test joined to the job (torchrun's env, Gloo), with its world comm also wrapped by a
// comms logger: for the tests that check the bytes a collective puts on the wire.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dscpp/comm/comm.h"
#include "dscpp/comm/comms_logger.h"
#include "dscpp/comm/dist_env.h"

namespace dscpp::testing {

struct LoggedWorld {
  std::shared_ptr<Comm> world;  // unlogged: splits and the closing barrier
  std::shared_ptr<CommsLogger> logger;
  std::shared_ptr<Comm> comm;   // `world`, every collective counted by `logger`
  int rank = 0;
  int size = 1;

  static LoggedWorld join() {
    LoggedWorld w;
    w.world = init_comm(DistEnv::from_env(), CommBackend::kGloo);
    w.rank = w.world->rank();
    w.size = w.world->world_size();
    CommsLoggerConfig logging;
    logging.enabled = true;
    w.logger = std::make_shared<CommsLogger>(logging, w.rank, w.size, [](const std::string&) {});
    w.comm = make_logged_comm(w.world, w.logger);
    return w;
  }

  // The bytes `op` moved, over every message size (0 if it never ran).
  int64_t bytes(const std::string& op) const {
    const auto stats = logger->stats();
    int64_t total = 0;
    if (const auto it = stats.find(op); it != stats.end()) {
      for (const auto& [size, s] : it->second) total += s.bytes;
    }
    return total;
  }
};

}  // namespace dscpp::testing
