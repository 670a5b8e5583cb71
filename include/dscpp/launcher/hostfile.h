// The resource pool of a launch: hosts and their slots, read from an MPI-style hostfile and narrowed by DeepSpeed's
// `--include` / `--exclude` syntax (`host1:0,2@host2` = slots 0 and 2 of host1, all of host2).
#pragma once

#include <string>
#include <vector>

namespace dscpp::launcher {

// One host and the slot ids (device indices) used on it; local rank i runs on slots[i].
struct HostSlots {
  std::string host;
  std::vector<int> slots;
  bool operator==(const HostSlots& other) const { return host == other.host && slots == other.slots; }
};

// Hosts in hostfile order; that order decides rank numbering.
using Resources = std::vector<HostSlots>;

// Slots 0 .. n-1: a host's slots when the hostfile or the command line gives only their count.
std::vector<int> slot_range(int n);

// `text` without leading and trailing whitespace (the hostfile's and `.deepspeed_env`'s lines).
std::string trim(const std::string& text);

// Parses hostfile text: one `HOST slots=N` per line (anything after N is ignored, as in DeepSpeed), blank lines and
// `#` comment lines skipped. `source` names the file in errors. Throws std::invalid_argument naming `source:line` for
// a duplicate host, a bad slot count or any other line, and for a file that lists no host.
Resources parse_hostfile(const std::string& text, const std::string& source);

// Reads and parses the hostfile at `path`; a missing or unreadable file is an error naming it.
Resources read_hostfile(const std::string& path);

// Parses a node spec `NAME[:SLOT[,SLOT...]][@NAME...]` into hosts in the order written, without checking them
// against a pool (used to hand the resolved world to remote launchers). Throws on an empty name or a bad slot.
Resources parse_node_spec(const std::string& spec, const std::string& flag);

// The inverse of parse_node_spec: `h1:0,1@h2:0,1`.
std::string format_node_spec(const Resources& resources);

// DeepSpeed's parse_resource_filter: `include` keeps only the named hosts/slots, `exclude` removes them; hosts left
// with no slot are dropped and `pool` order is kept. Both non-empty, an unknown host or a slot the host does not have
// is an error naming it. Both empty returns `pool` unchanged.
Resources filter_resources(const Resources& pool, const std::string& include, const std::string& exclude);

}  // namespace dscpp::launcher
