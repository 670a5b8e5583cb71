// Which local address Gloo binds to (and so advertises to its peers) when GLOO_SOCKET_IFNAME is not set, found as
// NCCL finds its socket interface: the interface that holds the master's address, else the one the kernel routes
// the master's address through, else one on the master's subnet. Gloo's own default binds to what this host's name
// resolves to — 127.0.0.1 in containers and under Debian's 127.0.1.1 convention — and a peer on another host then
// fails to connect to it with an error that blames a dead rank. A loopback address is chosen only when every rank is
// on this host; otherwise the job stops at start-up saying what was seen.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dscpp {

// One address of one network interface, as getifaddrs reports it.
struct NetAddress {
  std::string interface;       // "eth0"
  std::string address;         // numeric, "10.231.0.2" or "fd00::2"
  std::vector<uint8_t> bytes;  // network order: 4 bytes (IPv4) or 16 (IPv6)
  int prefix_length = 0;       // from the netmask
  bool loopback = false;       // IFF_LOOPBACK or a loopback address
  bool up = false;             // IFF_UP
};

// What was chosen, and why (for the start-up log line).
struct GlooBinding {
  std::string interface;
  std::string address;
  std::string reason;  // e.g. "the route to MASTER_ADDR goes through it"
};

// What the choice is made from: everything a host can tell about itself and the master, gathered by gather_*.
struct BindingInputs {
  std::string master_addr;                 // as the user gave it (MASTER_ADDR)
  std::vector<NetAddress> master;          // what it resolved to (empty: it did not resolve)
  std::vector<NetAddress> local;           // this host's interfaces
  std::optional<std::string> route_source; // the local address the kernel would send to the master from
  bool multi_node = false;                 // ranks on other hosts must reach this one
  std::string hostname;                    // gethostname(), for the error
  std::vector<std::string> hostname_resolves_to;
};

// Pure: the binding for `in`, or CommError naming the master address, what it resolved to, the hostname and what that
// resolved to, the interfaces seen, and GLOO_SOCKET_IFNAME.
GlooBinding choose_gloo_binding(const BindingInputs& in);

// Gathers the inputs on this host: resolves `master_addr`, lists the interfaces, asks the kernel's routing table for
// the source address towards master_addr:port (a connected UDP socket; nothing is sent). Never throws for an address
// that does not resolve: choose_gloo_binding reports it.
BindingInputs gather_binding_inputs(const std::string& master_addr, int master_port, bool multi_node);

// Parses a numeric address into a NetAddress (bytes, loopback); nullopt if `text` is not one.
std::optional<NetAddress> parse_numeric_address(const std::string& text);

}  // namespace dscpp
