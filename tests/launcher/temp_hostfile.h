// write_hostfile: a hostfile for one test, written into this process's temporary directory (the world and plan
// tests read them as a user's --hostfile).
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "../common/subprocess.h"

namespace dscpp::launcher {

inline std::string write_hostfile(const std::string& name, const std::string& text) {
  static const std::filesystem::path dir = dscpp::testing::temp_dir("launcher_hostfiles");
  std::ofstream(dir / name) << text;
  return (dir / name).string();
}

}  // namespace dscpp::launcher
