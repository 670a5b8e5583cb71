// tune_host_malloc: after it, blocks up to 32 MiB come from the heap and a freed block at its top stays there for the
// next step (mallinfo2 counts mapped blocks and heap bytes); larger blocks are still mapped. ctest runs each TEST in a
// process of its own, so each starts from glibc's defaults.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "dscpp/dscpp.h"
#include "../common/sanitizer.h"
#include "dscpp/engine/host_malloc.h"
#include "test_models.h"

namespace dscpp::testing {
namespace {

// The compiler may drop a malloc whose block never escapes; this makes it escape.
void keep(void* p) { asm volatile("" : : "r"(p) : "memory"); }

// Whether malloc maps a block of `bytes` (rather than carving it from the heap).
bool mapped(size_t bytes) {
  const auto before = mallinfo2().hblks;
  void* p = std::malloc(bytes);
  std::memset(p, 1, bytes);
  keep(p);
  const bool out = mallinfo2().hblks > before;
  std::free(p);
  return out;
}

TEST(HostMalloc, BlocksUpTo32MiBStayInTheHeapAndFreedOnesAreKept) {
  DSCPP_SKIP_WHEN_SANITIZED("ASan replaces glibc's malloc, whose tuning this tests");
  const auto tuning = tune_host_malloc();
  ASSERT_TRUE(tuning.applied) << tuning.reason;
  EXPECT_FALSE(mapped(size_t{1} << 20));
  EXPECT_FALSE(mapped(size_t{16} << 20));
  // Above it, a block the heap's free memory cannot serve is mapped, and unmapped on free (256 MiB: more than this
  // process's heap holds).
  EXPECT_TRUE(mapped(size_t{256} << 20)) << "heap " << mallinfo2().arena << " B";
  // A 24 MiB block at the heap's top, freed, is kept for reuse: the heap does not shrink.
  void* block = std::malloc(size_t{24} << 20);
  std::memset(block, 1, size_t{24} << 20);
  keep(block);
  const auto heap = mallinfo2().arena;
  std::free(block);
  EXPECT_EQ(mallinfo2().arena, heap);
  EXPECT_TRUE(tune_host_malloc().applied) << "a second call returns the first call's result";
}

TEST(HostMalloc, InitializeTunesMalloc) {
  DSCPP_SKIP_WHEN_SANITIZED("ASan replaces glibc's malloc, whose tuning this tests");
  auto model = Mlp();
  InitOptions init;
  init.log = [](const std::string&) {};
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 4,
      "optimizer": {"type": "Adam", "params": {"lr": 0.01}}})"), init);
  EXPECT_FALSE(mapped(size_t{8} << 20));
}

// glibc reads its tunables at startup; the check only needs to see that the user chose them.
TEST(HostMalloc, LeavesMallocAloneWhereTheEnvironmentTunesIt) {
  ASSERT_EQ(setenv("MALLOC_TRIM_THRESHOLD_", "1048576", 1), 0);
  const auto tuning = tune_host_malloc();
  EXPECT_FALSE(tuning.applied);
  EXPECT_NE(tuning.reason.find("MALLOC_TRIM_THRESHOLD_"), std::string::npos) << tuning.reason;
}

TEST(HostMalloc, DscppMallocTuningZeroKeepsGlibcsOwnPolicy) {
  ASSERT_EQ(setenv("DSCPP_MALLOC_TUNING", "0", 1), 0);
  const auto tuning = tune_host_malloc();
  EXPECT_FALSE(tuning.applied);
  EXPECT_EQ(tuning.reason, "DSCPP_MALLOC_TUNING=0");
}

}  // namespace
}  // namespace dscpp::testing
