// temp_dir's directories are removed when the process that made them exits, kept with DSCPP_KEEP_TEST_DIRS=1, and
// never removed by a forked child of that process.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "subprocess.h"

namespace {

namespace fs = std::filesystem;
using dscpp::testing::run_command;
using dscpp::testing::temp_dir;

// Started again as a child with DSCPP_TEMP_DIRS_CHILD set, this binary makes a directory with a file in it, prints its
// path and exits normally, before GoogleTest's main runs: the child's exit is what the tests observe.
const bool kChild = [] {
  if (std::getenv("DSCPP_TEMP_DIRS_CHILD") == nullptr) return false;
  const fs::path dir = temp_dir("helpers_child");
  std::ofstream(dir / "state.bin") << "saved";
  std::printf("%s\n", dir.c_str());
  std::exit(0);
}();

std::string self_exe() { return fs::read_symlink("/proc/self/exe").string(); }

fs::path child_dir(const std::string& env) {
  const auto result = run_command(env + " DSCPP_TEMP_DIRS_CHILD=1 " + self_exe());
  EXPECT_EQ(result.code, 0) << result.err;
  std::string path = result.out;
  while (!path.empty() && path.back() == '\n') path.pop_back();
  EXPECT_FALSE(path.empty());
  return path;
}

TEST(TempDirs, RemovedWhenTheProcessExits) {
  const fs::path dir = child_dir("DSCPP_KEEP_TEST_DIRS=0");
  EXPECT_NE(dir.string().find("dscpp_test_helpers_child_"), std::string::npos) << dir;
  EXPECT_FALSE(fs::exists(dir)) << dir;
}

TEST(TempDirs, KeptForAPostMortemWhenAsked) {
  const fs::path dir = child_dir("DSCPP_KEEP_TEST_DIRS=1");
  EXPECT_TRUE(fs::exists(dir / "state.bin")) << dir;
  fs::remove_all(dir);
}

// A forked child (a rank started with fork, a death test) that exits normally runs static destructors too: it must
// leave its parent's directories alone.
TEST(TempDirs, AForkedChildLeavesItsParentsDirectories) {
  const fs::path dir = temp_dir("helpers_parent");
  std::ofstream(dir / "state.bin") << "saved";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) std::exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_TRUE(fs::exists(dir / "state.bin"));
}

}  // namespace
