// Rendezvous: the c10d TCPStore every rank meets at (rank 0 hosts it), and a join check that names the ranks that
// never arrived instead of letting the process group hang on them.
#pragma once

#include "c10d_headers.h"
#include "dscpp/comm/comm.h"

namespace dscpp {

// Connects to (rank 0: hosts) the store at env.master_addr:env.master_port, then waits until every rank has
// checked in. Throws CommError within env.timeout naming this rank, the address, and which ranks are missing.
c10::intrusive_ptr<c10d::Store> rendezvous(const DistEnv& env);

// The key prefix of one attempt's keys in torchrun's agent store ("/worker/attempt_<TORCHELASTIC_RESTART_COUNT>", as
// torch.distributed uses): the agent's store outlives attempts, so a restart must not read a failed attempt's keys.
std::string agent_attempt_prefix(const DistEnv& env);

// A TCP socket listening on `addr`:`port` only (for stores that can adopt one); throws CommError naming both.
int listen_on(const std::string& addr, int port);

}  // namespace dscpp
