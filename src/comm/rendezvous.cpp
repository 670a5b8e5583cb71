// Rendezvous over c10d's TCPStore. Every rank sets "dscpp/joined/<rank>" and polls until all keys exist, so a missing
// peer is reported by rank number; polling with check() (not Store::wait) keeps the store's protocol in step after
// a timeout, which lets us ask afterwards who is missing.
#include "rendezvous.h"

#include <errno.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>
#include <thread>

#include "comm_errors.h"

namespace dscpp {
namespace {

std::string where(const DistEnv& env) {
  return env.master_addr + ":" + std::to_string(env.master_port);
}

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out << static_cast<double>(ms.count()) / 1000.0 << " s";
  return out.str();
}

std::string joined_key(int rank) { return "dscpp/joined/" + std::to_string(rank); }

}  // namespace

int listen_on(const std::string& addr, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (::getaddrinfo(addr.c_str(), port_text.c_str(), &hints, &found) != 0 || found == nullptr)
    throw CommError("cannot resolve MASTER_ADDR='" + addr + "' to bind the rendezvous store");
  int fd = ::socket(found->ai_family, found->ai_socktype, found->ai_protocol);
  const int one = 1;
  const bool ok = fd >= 0 && ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
                  ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 128) == 0;
  ::freeaddrinfo(found);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    throw CommError("cannot listen on " + addr + ":" + port_text + " (MASTER_ADDR:MASTER_PORT) for the rendezvous "
                    "store; is the port in use or the address not this host's?");
  }
  return fd;
}

namespace {

// Throws CommError unless `addr` resolves to an address of this host (a socket can bind to it).
void require_local_address(const std::string& addr, const std::string& me) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(addr.c_str(), "0", &hints, &found) != 0 || found == nullptr)
    throw CommError(me + ": cannot resolve MASTER_ADDR='" + addr + "' (rank 0 hosts the rendezvous store there)");
  bool local = false;
  for (const addrinfo* a = found; a != nullptr && !local; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    local = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0 || errno != EADDRNOTAVAIL;
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (!local) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    throw CommError(me + ": MASTER_ADDR='" + addr + "' is not an address of this host (" + host +
                    "), but rank 0 runs here and hosts the rendezvous store at MASTER_ADDR. Give every node the "
                    "address of the node that runs rank 0 (--master_addr, or the first host of the hostfile)");
  }
}

}  // namespace

std::string agent_attempt_prefix(const DistEnv& env) {
  return "/worker/attempt_" + std::to_string(env.restart_count);
}

c10::intrusive_ptr<c10d::Store> rendezvous(const DistEnv& env) {
  const std::string me = "rank " + std::to_string(env.rank) + "/" + std::to_string(env.world_size);
  const auto deadline = std::chrono::steady_clock::now() + env.timeout;

  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = env.rank == 0 && !env.agent_store;  // torchrun's agent may already serve it
  options.waitWorkers = false;  // we count arrivals ourselves, to name the missing ranks
  options.timeout = env.timeout;
  // The others come to MASTER_ADDR: an address this host lacks would leave them knocking until the timeout while rank
  // 0 waits for them. The store listens on that address only (docs/security.md): c10d's TCPStore would listen on
  // every interface, so it adopts a socket we bound ourselves.
  if (options.isServer) {
    require_local_address(env.master_addr, me);
    options.masterListenFd = listen_on(env.master_addr, env.master_port);
  }

  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
  } catch (const std::exception& e) {
    if (options.isServer)
      throw CommError(me + ": cannot host the rendezvous store on port " + std::to_string(env.master_port) +
                      " (MASTER_PORT): " + reason(e) + ". Is another job using the port?");
    if (env.agent_store)
      throw CommError(me + ": could not reach torchrun's agent store at " + where(env) + " within " +
                      seconds(env.timeout) + ": " + reason(e) + " (TORCHELASTIC_USE_AGENT_STORE=True)");
    throw CommError(me + ": could not reach rank 0's rendezvous store at " + where(env) + " within " +
                    seconds(env.timeout) + ": " + reason(e) +
                    ". Is rank 0 running, with the same MASTER_ADDR/MASTER_PORT?");
  }
  // The agent's store outlives our attempts: each attempt's keys under their own prefix, as torch.distributed does.
  if (env.agent_store)
    store = c10::make_intrusive<c10d::PrefixStore>(agent_attempt_prefix(env), store);

  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back(joined_key(r));
  try {
    store->set(joined_key(env.rank), std::vector<uint8_t>{1});
    while (!store->check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        std::vector<int> missing;
        for (int r = 0; r < env.world_size; ++r)
          if (!store->check({joined_key(r)})) missing.push_back(r);
        std::ostringstream list;
        for (size_t i = 0; i < missing.size(); ++i) list << (i ? ", " : "") << missing[i];
        throw CommError(me + ": rendezvous at " + where(env) + " timed out after " + seconds(env.timeout) + ": " +
                        std::to_string(env.world_size - static_cast<int>(missing.size())) + " of " +
                        std::to_string(env.world_size) + " ranks joined; missing rank(s) " + list.str() +
                        ". Did they start, with the same MASTER_ADDR/MASTER_PORT? (DEEPSPEED_TIMEOUT sets the wait)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(me + ": lost the rendezvous store at " + where(env) + " while waiting for the other ranks: " +
                    reason(e) + ". Rank 0 probably exited; see its log.");
  }
  return store;
}

}  // namespace dscpp
