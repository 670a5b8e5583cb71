// DSCPP_KILL_AT: parsed once per process, counted with an atomic (swap I/O passes its point from its own threads).
#include "dscpp/fault/kill_point.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <csignal>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace dscpp::fault {
namespace {

long long parse_number(const std::string& text, const std::string& field, long long min) {
  long long value = 0;
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || stop != end || value < min) {
    throw std::invalid_argument("DSCPP_KILL_AT: " + field + " '" + text + "' must be an integer >= " +
                                std::to_string(min));
  }
  return value;
}

int env_int(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? 0 : std::atoi(value);
}

struct Armed {
  KillRule rule;
  bool active = false;  // the rule names this rank and this start
  std::atomic<long long> hits{0};
};

Armed& armed() {
  // A bad DSCPP_KILL_AT throws here, at the first point passed, and again at every later one.
  static Armed* state = [] {
    const char* text = std::getenv("DSCPP_KILL_AT");
    const bool set = text != nullptr && *text != '\0';
    const KillRule rule = set ? parse_kill_rule(text) : KillRule{};
    auto* s = new Armed;  // never destroyed: points may be passed from threads during exit
    s->rule = rule;
    s->active = set && (rule.rank < 0 || rule.rank == env_int("RANK")) &&
                rule.restart == env_int("TORCHELASTIC_RESTART_COUNT");
    return s;
  }();
  return *state;
}

}  // namespace

KillRule parse_kill_rule(const std::string& text) {
  KillRule rule;
  std::istringstream fields(text);
  std::string field;
  std::getline(fields, field, ',');
  const size_t at = field.find('@');
  rule.point = field.substr(0, at);
  if (std::find(kKillPoints.begin(), kKillPoints.end(), rule.point) == kKillPoints.end()) {
    std::string known;
    for (const auto& p : kKillPoints) known += (known.empty() ? "" : ", ") + p;
    throw std::invalid_argument("DSCPP_KILL_AT: unknown point '" + rule.point + "' (known: " + known + ")");
  }
  if (at != std::string::npos) rule.hit = parse_number(field.substr(at + 1), "@N", 1);
  while (std::getline(fields, field, ',')) {
    const size_t eq = field.find('=');
    const std::string key = field.substr(0, eq), value = eq == std::string::npos ? "" : field.substr(eq + 1);
    if (key == "rank") {
      rule.rank = static_cast<int>(parse_number(value, "rank", 0));
    } else if (key == "restart") {
      rule.restart = static_cast<int>(parse_number(value, "restart", 0));
    } else {
      throw std::invalid_argument("DSCPP_KILL_AT: unknown field '" + field +
                                  "' (expected POINT[@N][,rank=R][,restart=K])");
    }
  }
  return rule;
}

void kill_point(const char* point) {
  Armed& state = armed();
  if (!state.active || state.rule.point != point) return;
  if (state.hits.fetch_add(1) + 1 == state.rule.hit) std::raise(SIGKILL);
}

}  // namespace dscpp::fault
