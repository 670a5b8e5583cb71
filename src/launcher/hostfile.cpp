// Hostfile parsing and DeepSpeed's include/exclude filters; every error names the file and line or the spec part.
#include "dscpp/launcher/hostfile.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace dscpp::launcher {
std::string trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

std::vector<int> slot_range(int n) {
  std::vector<int> slots(n);
  for (int i = 0; i < n; ++i) slots[i] = i;
  return slots;
}

namespace {

bool all_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Slot counts and ids beyond this are typos, not hardware.
constexpr int kMaxSlot = 1 << 20;

int parse_slot(const std::string& text, const std::string& where) {
  if (!all_digits(text) || text.size() > 7 || std::stoi(text) > kMaxSlot) {
    throw std::invalid_argument(where + ": bad slot '" + text + "' (expected a non-negative integer)");
  }
  return std::stoi(text);
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!text.empty() && text.back() == sep) parts.emplace_back();
  if (text.empty()) parts.emplace_back();
  return parts;
}

const HostSlots* find_host(const Resources& resources, const std::string& host) {
  for (const auto& entry : resources) {
    if (entry.host == host) return &entry;
  }
  return nullptr;
}

HostSlots* find_host(Resources& resources, const std::string& host) {
  for (auto& entry : resources) {
    if (entry.host == host) return &entry;
  }
  return nullptr;
}

// Host names reach ssh's and srun's command lines: a name ssh could take for an option ("-oProxyCommand=...") or a
// shell could take for code (";", "$(...)", quotes) is refused, not quoted. What is left is what DNS names and IPv4
// addresses use (':' and '@' separate slots and nodes in DeepSpeed's --include syntax).
void check_host_name(const std::string& host, const std::string& where) {
  const bool plain = !host.empty() && host[0] != '-' && host[0] != '.' &&
                     std::all_of(host.begin(), host.end(), [](char c) {
                       return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
                     });
  if (!plain) {
    throw std::invalid_argument(where + ": host name '" + host + "' is not allowed: a host name or IPv4 address "
                                "(letters, digits, '.', '-', '_'; not starting with '-' or '.')");
  }
}

}  // namespace

Resources parse_hostfile(const std::string& text, const std::string& source) {
  Resources pool;
  std::istringstream in(text);
  std::string raw;
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    const std::string line = trim(raw);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = source + ":" + std::to_string(line_no);
    std::istringstream fields(line);
    std::string host, slots_field;
    fields >> host >> slots_field;
    const std::string prefix = "slots=";
    if (slots_field.compare(0, prefix.size(), prefix) != 0) {
      throw std::invalid_argument(where + ": expected 'HOST slots=N', got '" + line + "'");
    }
    const std::string count = slots_field.substr(prefix.size());
    // Bounded like a slot id (kMaxSlot): a count whose ids --include could not name is a typo (found by fuzzing: a
    // host of 6,666,666 slots made the world's description megabytes long).
    if (!all_digits(count) || count.size() > 7 || std::stoi(count) == 0 || std::stoi(count) > kMaxSlot) {
      throw std::invalid_argument(where + ": bad slot count '" + count + "' for host '" + host +
                                  "' (expected a positive integer up to " + std::to_string(kMaxSlot) + ")");
    }
    check_host_name(host, where);
    if (find_host(pool, host) != nullptr) {
      throw std::invalid_argument(where + ": host '" + host + "' is listed twice");
    }
    pool.push_back({host, slot_range(std::stoi(count))});
  }
  if (pool.empty()) throw std::invalid_argument(source + ": the hostfile lists no host ('HOST slots=N' lines)");
  return pool;
}

Resources read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("--hostfile '" + path + "': cannot read the file");
  std::stringstream text;
  text << in.rdbuf();
  return parse_hostfile(text.str(), path);
}

Resources parse_node_spec(const std::string& spec, const std::string& flag) {
  Resources nodes;
  const std::string where = flag + " '" + spec + "'";  // once: per node it made long specs quadratic (fuzzing)
  for (const std::string& node : split(spec, '@')) {
    const size_t colon = node.find(':');
    HostSlots entry{node.substr(0, colon), {}};
    if (entry.host.empty()) {
      throw std::invalid_argument(where + ": empty host name (expected NAME[:SLOT,...][@NAME...])");
    }
    check_host_name(entry.host, where);
    if (colon != std::string::npos) {
      for (const std::string& slot : split(node.substr(colon + 1), ',')) entry.slots.push_back(parse_slot(slot, where));
    }
    nodes.push_back(entry);
  }
  return nodes;
}

std::string format_node_spec(const Resources& resources) {
  std::string spec;
  for (const auto& entry : resources) {
    if (!spec.empty()) spec += '@';
    spec += entry.host;
    for (size_t i = 0; i < entry.slots.size(); ++i) spec += (i == 0 ? ":" : ",") + std::to_string(entry.slots[i]);
  }
  return spec;
}

Resources filter_resources(const Resources& pool, const std::string& include, const std::string& exclude) {
  if (!include.empty() && !exclude.empty()) {
    throw std::invalid_argument("--include and --exclude are mutually exclusive; give one of them");
  }
  if (include.empty() && exclude.empty()) return pool;
  const bool including = !include.empty();
  const std::string flag = including ? "--include" : "--exclude";
  Resources chosen = including ? Resources{} : pool;
  for (const HostSlots& node : parse_node_spec(including ? include : exclude, flag)) {
    const HostSlots* known = find_host(pool, node.host);
    if (known == nullptr) throw std::invalid_argument(flag + ": host '" + node.host + "' is not in the hostfile");
    for (int slot : node.slots) {
      if (std::find(known->slots.begin(), known->slots.end(), slot) == known->slots.end()) {
        throw std::invalid_argument(flag + ": host '" + node.host + "' has no slot " + std::to_string(slot) +
                                    " (it has " + std::to_string(known->slots.size()) + " slots)");
      }
    }
    HostSlots* entry = find_host(chosen, node.host);
    if (including) {
      // A host named twice accumulates its slots (DeepSpeed would keep only the last list).
      if (entry == nullptr) chosen.push_back({node.host, {}});
      entry = find_host(chosen, node.host);
      const std::vector<int>& add = node.slots.empty() ? known->slots : node.slots;
      entry->slots.insert(entry->slots.end(), add.begin(), add.end());
    } else if (entry != nullptr) {
      if (node.slots.empty()) {
        entry->slots.clear();
      } else {
        for (int slot : node.slots) entry->slots.erase(std::remove(entry->slots.begin(), entry->slots.end(), slot),
                                                       entry->slots.end());
      }
    }
  }
  // Pool order decides ranks; slots keep the order written, first occurrence wins (DeepSpeed's
  // _stable_remove_duplicates), so `h:2,0` maps local rank 0 to device 2; hosts left empty are dropped.
  Resources ordered;
  for (const auto& host : pool) {
    HostSlots* entry = find_host(chosen, host.host);
    if (entry == nullptr) continue;
    std::vector<int> unique;
    for (int slot : entry->slots) {
      if (std::find(unique.begin(), unique.end(), slot) == unique.end()) unique.push_back(slot);
    }
    if (!unique.empty()) ordered.push_back({entry->host, unique});
  }
  if (ordered.empty()) throw std::invalid_argument(flag + " leaves no slot to run on");
  return ordered;
}

}  // namespace dscpp::launcher
