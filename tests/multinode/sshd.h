// An sshd on each of the two hosts (Debian's openssh-server), with a host key and a client key generated into the
// test's directory, listening only on its host's address, and an `ssh` on PATH that uses them — as a user's
// ~/.ssh/config would. The sshds live in the namespaces, so TwoHosts' cleanup stops them.
#pragma once

#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>

#include "../common/subprocess.h"
#include "two_hosts.h"

namespace dscpp::testing {

class SshHosts {
 public:
  static std::optional<std::string> unavailable() {
    for (const char* tool : {"/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/ssh-keygen"})
      if (!std::filesystem::exists(tool)) return std::string(tool) + " is missing (Debian's openssh-server)";
    return std::nullopt;
  }

  // Hosts "node0" and "node1" at hosts.address(0|1), reached as root with a key made here.
  SshHosts(const TwoHosts& hosts, const std::filesystem::path& dir) : bin_(dir / "bin") {
    namespace fs = std::filesystem;
    fs::create_directories(bin_);
    fs::create_directories("/run/sshd");  // sshd's privilege-separation directory
    const auto host_key = dir / "host_key", client_key = dir / "client_key";
    for (const auto& key : {host_key, client_key}) {
      const auto made = run_command("ssh-keygen -q -t ed25519 -N '' -f " + key.string());
      if (made.code != 0) throw std::runtime_error("ssh-keygen failed: " + made.err);
    }
    fs::copy_file(client_key.string() + ".pub", dir / "authorized_keys", fs::copy_options::overwrite_existing);
    const std::string host_pub = read_text(host_key.string() + ".pub");
    std::ofstream known(dir / "known_hosts"), config(dir / "ssh_config");
    for (int h = 0; h < 2; ++h) {
      const std::string name = "node" + std::to_string(h);
      known << name << "," << hosts.address(h) << " " << host_pub;
      config << "Host " << name << "\n  HostName " << hosts.address(h) << "\n";
      const auto sshd_config = dir / ("sshd_config" + std::to_string(h));
      std::ofstream(sshd_config) << "ListenAddress " << hosts.address(h) << "\nHostKey " << host_key.string()
                                 << "\nPidFile " << (dir / ("sshd" + std::to_string(h) + ".pid")).string()
                                 << "\nAuthorizedKeysFile " << (dir / "authorized_keys").string()
                                 << "\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                                    "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n";
      // sshd listens before it detaches, so a connection made after this returns is accepted.
      const auto started = run_command(hosts.on(h, "/usr/sbin/sshd -f " + sshd_config.string()));
      if (started.code != 0) throw std::runtime_error("sshd on " + name + " failed: " + started.err);
    }
    config << "Host *\n  User root\n  IdentityFile " << client_key.string() << "\n  IdentitiesOnly yes\n"
           << "  UserKnownHostsFile " << (dir / "known_hosts").string() << "\n  GlobalKnownHostsFile /dev/null\n"
           << "  StrictHostKeyChecking yes\n";
    config.close();
    std::ofstream ssh(bin_ / "ssh");
    ssh << "#!/bin/sh\nexec /usr/bin/ssh -F " << (dir / "ssh_config").string() << " \"$@\"\n";
    ssh.close();
    fs::permissions(bin_ / "ssh", fs::perms::owner_all);
  }

  // A PATH whose `ssh` uses these keys and hosts.
  std::string path() const { return bin_.string() + ":/usr/sbin:/usr/bin:/sbin:/bin"; }

 private:
  std::filesystem::path bin_;
};

}  // namespace dscpp::testing
