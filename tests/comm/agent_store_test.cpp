// torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE=True): the agent serves the store and outlives each attempt of
// the job, so a restarted rank meets the failed attempt's keys there. They must not count: a rank of attempt 0 that
// joined and died is not a rank of attempt 1.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <string>

#include "../common/error_of.h"
#include "../common/multiprocess.h"
#include "dscpp/comm/comm.h"
#include "dscpp/comm/dist_env.h"

namespace dscpp {
namespace {

TEST(AgentStore, ARestartedRankDoesNotCountTheFailedAttemptsRanks) {
  // The agent: a store server of its own, holding what attempt 0's rank 1 wrote before it died.
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(testing::free_port());
  options.isServer = true;
  options.waitWorkers = false;
  const auto agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  agent->set("/worker/attempt_0/dscpp/joined/1", std::vector<uint8_t>{1});

  // Attempt 1's rank 0, alone: rank 1 of this attempt never comes.
  const DistEnv env = DistEnv::from_map({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                         {"MASTER_PORT", std::to_string(options.port)},
                                         {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                         {"TORCHELASTIC_RESTART_COUNT", "1"}, {"DEEPSPEED_TIMEOUT", "0.02"}});
  const std::string message = testing::error_of<CommError>([&] { init_comm(env, CommBackend::kGloo); });
  EXPECT_NE(message.find("1 of 2 ranks joined; missing rank(s) 1"), std::string::npos) << message;
  // This attempt's keys are its own.
  EXPECT_TRUE(agent->check({"/worker/attempt_1/dscpp/joined/0"}));
}

}  // namespace
}  // namespace dscpp
