// Choosing Gloo's local address (see gloo_interface.h): a pure choice over what gather_binding_inputs reads from the
// host, so every rule is testable with made-up interfaces.
#include "dscpp/comm/gloo_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <sstream>

#include "dscpp/comm/comm.h"

namespace dscpp {
namespace {

bool is_loopback_bytes(const std::vector<uint8_t>& b) {
  if (b.size() == 4) return b[0] == 127;
  if (b.size() == 16) {
    for (size_t i = 0; i < 15; ++i)
      if (b[i] != 0) return false;
    return b[15] == 1;  // ::1
  }
  return false;
}

// The address of a sockaddr as NetAddress (no interface, prefix 0); nullopt for other families.
std::optional<NetAddress> from_sockaddr(const sockaddr* sa) {
  if (sa == nullptr) return std::nullopt;
  NetAddress out;
  char text[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    const auto* p = reinterpret_cast<const uint8_t*>(&in->sin_addr);
    out.bytes.assign(p, p + 4);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
  } else if (sa->sa_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(sa);
    const auto* p = reinterpret_cast<const uint8_t*>(&in->sin6_addr);
    out.bytes.assign(p, p + 16);
    ::inet_ntop(AF_INET6, &in->sin6_addr, text, sizeof(text));
  } else {
    return std::nullopt;
  }
  out.address = text;
  out.loopback = is_loopback_bytes(out.bytes);
  return out;
}

int prefix_of(const sockaddr* mask) {
  const auto parsed = from_sockaddr(mask);
  if (!parsed) return 0;
  int bits = 0;
  for (uint8_t byte : parsed->bytes)
    for (int bit = 7; bit >= 0 && (byte >> bit & 1); --bit) ++bits;
  return bits;
}

bool same_subnet(const NetAddress& a, const NetAddress& local) {
  if (a.bytes.size() != local.bytes.size() || local.prefix_length <= 0) return false;
  for (int bit = 0; bit < local.prefix_length; ++bit) {
    const int byte = bit / 8, shift = 7 - bit % 8;
    if ((a.bytes[byte] >> shift & 1) != (local.bytes[byte] >> shift & 1)) return false;
  }
  return true;
}

std::vector<NetAddress> resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::vector<NetAddress> out;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return out;
  for (addrinfo* p = found; p != nullptr; p = p->ai_next) {
    auto a = from_sockaddr(p->ai_addr);
    if (!a) continue;
    bool seen = false;
    for (const auto& b : out) seen = seen || b.address == a->address;
    if (!seen) out.push_back(*a);
  }
  ::freeaddrinfo(found);
  return out;
}

std::vector<NetAddress> list_interfaces() {
  std::vector<NetAddress> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* p = list; p != nullptr; p = p->ifa_next) {
    auto a = from_sockaddr(p->ifa_addr);
    if (!a) continue;
    a->interface = p->ifa_name;
    a->prefix_length = prefix_of(p->ifa_netmask);
    a->loopback = a->loopback || (p->ifa_flags & IFF_LOOPBACK) != 0;
    a->up = (p->ifa_flags & IFF_UP) != 0;
    out.push_back(*a);
  }
  ::freeifaddrs(list);
  return out;
}

// The source address the kernel picks for traffic to `to`: connect() on a UDP socket consults the routing table and
// sends nothing.
std::optional<std::string> route_source(const std::string& to, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(to.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return std::nullopt;
  std::optional<std::string> out;
  for (addrinfo* p = found; p != nullptr && !out; p = p->ai_next) {
    const int fd = ::socket(p->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (::connect(fd, p->ai_addr, p->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      if (auto a = from_sockaddr(reinterpret_cast<sockaddr*>(&local))) out = a->address;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return out;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out.empty() ? "nothing" : out;
}

std::string describe(const BindingInputs& in, const std::string& problem) {
  std::vector<std::string> master, seen;
  for (const auto& a : in.master) master.push_back(a.address);
  for (const auto& a : in.local)
    seen.push_back(a.interface + " " + a.address + "/" + std::to_string(a.prefix_length) + (a.up ? "" : " (down)"));
  std::ostringstream out;
  out << "cannot choose the network interface for Gloo: " << problem << ". MASTER_ADDR '" << in.master_addr
      << "' resolved to " << join(master) << "; this host's name '" << in.hostname << "' resolves to "
      << join(in.hostname_resolves_to) << "; interfaces seen: " << join(seen)
      << ". Set GLOO_SOCKET_IFNAME to the interface that reaches the other hosts (comma-separated for several), "
         "or MASTER_ADDR to an address this host can reach";
  return out.str();
}

}  // namespace

std::optional<NetAddress> parse_numeric_address(const std::string& text) {
  sockaddr_in v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4.sin_addr) == 1) {
    v4.sin_family = AF_INET;
    return from_sockaddr(reinterpret_cast<sockaddr*>(&v4));
  }
  sockaddr_in6 v6{};
  if (::inet_pton(AF_INET6, text.c_str(), &v6.sin6_addr) == 1) {
    v6.sin6_family = AF_INET6;
    return from_sockaddr(reinterpret_cast<sockaddr*>(&v6));
  }
  return std::nullopt;
}

GlooBinding choose_gloo_binding(const BindingInputs& in) {
  if (in.master.empty()) throw CommError(describe(in, "MASTER_ADDR does not resolve to an address"));
  auto usable = [&](const NetAddress& a) { return a.up && (!in.multi_node || !a.loopback); };

  // 1. This host is the master: bind to the interface that holds its address.
  for (const auto& m : in.master)
    for (const auto& a : in.local)
      if (a.address == m.address && a.up) {
        if (!usable(a))
          throw CommError(describe(in, "the master's address is a loopback address of this host, but the job spans "
                                       "hosts, whose ranks cannot reach it"));
        return {a.interface, a.address, "the interface holds MASTER_ADDR"};
      }
  // 2. The interface the kernel routes the master's address through.
  if (in.route_source) {
    for (const auto& a : in.local)
      if (a.address == *in.route_source && usable(a)) return {a.interface, a.address, "the route to MASTER_ADDR goes through it"};
  }
  // 3. An interface on the master's subnet.
  for (const auto& m : in.master)
    for (const auto& a : in.local)
      if (usable(a) && !a.loopback && same_subnet(m, a)) return {a.interface, a.address, "it is on MASTER_ADDR's subnet"};
  // A single-host job whose master is a loopback address this host lacks as such (127.0.1.1 on Debian): loopback
  // reaches every rank.
  if (!in.multi_node)
    for (const auto& m : in.master)
      if (m.loopback)
        for (const auto& a : in.local)
          if (a.loopback && a.up && a.bytes.size() == m.bytes.size()) return {a.interface, m.address, "loopback: every rank is on this host"};
  throw CommError(describe(in, "no interface of this host holds, routes to, or shares a subnet with the master's "
                               "address"));
}

BindingInputs gather_binding_inputs(const std::string& master_addr, int master_port, bool multi_node) {
  BindingInputs in;
  in.master_addr = master_addr;
  in.master = resolve(master_addr);
  in.local = list_interfaces();
  in.route_source = route_source(master_addr, master_port);
  in.multi_node = multi_node;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) == 0) in.hostname = name;
  for (const auto& a : resolve(in.hostname)) in.hostname_resolves_to.push_back(a.address);
  return in;
}

}  // namespace dscpp
