// Two hosts on one machine: network namespaces joined by a veth pair, as two machines joined by a switch. Each test
// that uses them makes its own pair (names carry the test's pid, so tests run side by side) and removes it — every
// process inside killed, the namespaces deleted, the veth with them — also when the test fails.
//
// The namespaces share this machine's hostname and /etc/hosts, so the hostname resolves to loopback on both: the
// container case in which Gloo's default device advertises 127.0.0.1 to the other host.
#pragma once

#include <unistd.h>

#include <fstream>
#include <optional>
#include <string>

#include "../common/subprocess.h"

namespace dscpp::testing {

class TwoHosts {
 public:
  // Why these tests cannot run here (not root, no `ip netns`), or nullopt when they can.
  static std::optional<std::string> unavailable() {
    if (::geteuid() != 0) return "creating network namespaces needs root";
    const std::string probe = "dscppprobe" + std::to_string(::getpid());
    const auto made = run_command("ip netns add " + probe);
    if (made.code != 0) return "`ip netns add` failed: " + made.err;
    run_command("ip netns del " + probe);
    return std::nullopt;
  }

  TwoHosts() {
    const std::string id = std::to_string(::getpid());
    for (int h = 0; h < 2; ++h) {
      ns_[h] = "dscpp" + id + (h == 0 ? "a" : "b");
      link_[h] = "dsv" + id + (h == 0 ? "a" : "b");  // at most 15 characters: "dsv" + a pid of up to 7 digits + 1
      address_[h] = "10.231.0." + std::to_string(h + 1);
    }
    const std::string script =
        "set -e; ip netns add " + ns_[0] + "; ip netns add " + ns_[1] + "; ip link add " + link_[0] +
        " netns " + ns_[0] + " type veth peer name " + link_[1] + " netns " + ns_[1] + "; " +
        setup(0) + setup(1);
    const auto made = run_command("sh -c '" + script + "'");
    if (made.code != 0) {
      remove();
      throw std::runtime_error("could not make two hosts: " + made.err);
    }
  }
  ~TwoHosts() { remove(); }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  const std::string& address(int host) const { return address_[host]; }
  const std::string& link(int host) const { return link_[host]; }
  const std::string& name(int host) const { return ns_[host]; }  // the namespace
  // `command` as run on `host`.
  std::string on(int host, const std::string& command) const { return "ip netns exec " + ns_[host] + " " + command; }
  // Gives host h the name "node<h>", resolving to its address on both hosts: an /etc/hosts per namespace, which
  // `ip netns exec` mounts over /etc/hosts. on_named() runs a command under that name (a UTS namespace of its own).
  // Tools that advertise their hostname (torchrun's agents) then reach each other.
  void name_hosts() const {
    for (int h = 0; h < 2; ++h) {
      const std::string dir = "/etc/netns/" + ns_[h];
      run_command("mkdir -p " + dir);
      std::ofstream(dir + "/hosts") << "127.0.0.1 localhost\n" << address_[0] << " node0\n" << address_[1] << " node1\n";
    }
  }
  std::string on_named(int host, const std::string& command) const {
    return on(host, "unshare --uts sh -c \"hostname node" + std::to_string(host) + " && exec " + command + "\"");
  }
  // Takes the link down on both ends, as a cable pulled out.
  void cut() const {
    for (int h = 0; h < 2; ++h) run_command(on(h, "ip link set " + link_[h] + " down"));
  }

 private:
  std::string setup(int h) const {
    return on(h, "ip link set lo up") + "; " + on(h, "ip addr add " + address_[h] + "/24 dev " + link_[h]) + "; " +
           on(h, "ip link set " + link_[h] + " up") + "; ";
  }
  void remove() const {
    for (int h = 0; h < 2; ++h) {
      if (ns_[h].empty()) continue;
      run_command("ip netns pids " + ns_[h] + " 2>/dev/null | xargs -r kill -9");
      run_command("ip netns del " + ns_[h] + " 2>/dev/null");
      run_command("rm -rf /etc/netns/" + ns_[h]);
    }
  }

  std::string ns_[2], link_[2], address_[2];
};

}  // namespace dscpp::testing
