// Collects the variables exported to remote nodes: NCCL_*/UCX_*/TORCHELASTIC_* from the launcher, then `.deepspeed_env` files.
#include "dscpp/launcher/remote_env.h"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace dscpp::launcher {
namespace {

// TORCHELASTIC_*: the restart counters of `--max_restarts`, which the ranks on other nodes read as well.
constexpr const char* kExportPrefixes[] = {"NCCL_", "UCX_", "TORCHELASTIC_"};
constexpr const char* kDefaultEnvFile = ".deepspeed_env";

std::string lookup(const EnvMap& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? std::string() : it->second;
}

}  // namespace

EnvMap parse_env_file(const std::string& text, const std::string& source) {
  EnvMap vars;
  std::istringstream in(text);
  std::string raw;
  for (int line_no = 1; std::getline(in, raw); ++line_no) {
    const std::string line = trim(raw);
    if (line.empty() || line[0] == '#') continue;
    const size_t eq = line.find('=');
    const std::string key = eq == std::string::npos ? std::string() : trim(line.substr(0, eq));
    if (key.empty()) {
      throw std::invalid_argument(source + ":" + std::to_string(line_no) + ": expected KEY=VALUE, got '" + line + "'");
    }
    vars[key] = trim(line.substr(eq + 1));
  }
  return vars;
}

EnvMap remote_exports(const EnvMap& launcher_env, const std::string& cwd) {
  namespace fs = std::filesystem;
  EnvMap exports;
  for (const auto& [key, value] : launcher_env) {
    for (const char* prefix : kExportPrefixes) {
      if (key.rfind(prefix, 0) == 0) exports[key] = value;
    }
  }
  std::string name = lookup(launcher_env, "DS_ENV_FILE");
  if (name.empty()) name = kDefaultEnvFile;
  std::vector<fs::path> files;
  if (fs::path(name).is_absolute()) {
    files.push_back(name);
  } else {
    const std::string home = lookup(launcher_env, "HOME");
    if (!home.empty()) files.push_back(fs::path(home) / name);
    files.push_back(fs::path(cwd) / name);
  }
  for (const fs::path& file : files) {
    std::ifstream in(file);
    if (!in) continue;
    std::stringstream text;
    text << in.rdbuf();
    for (const auto& [key, value] : parse_env_file(text.str(), file.string())) exports[key] = value;
  }
  return exports;
}

}  // namespace dscpp::launcher
