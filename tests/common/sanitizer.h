// What the sanitized build (scripts/test.sh --sanitize, DSCPP_SANITIZED) changes for tests. A few tests mean nothing
// under AddressSanitizer and skip there, saying why: those that measure a process's memory (its shadow memory and the
// quarantine of freed blocks grow RSS by design) and those of glibc's malloc (ASan replaces malloc). They run in
// every other build.
#pragma once

#include <gtest/gtest.h>

namespace dscpp::testing {
// How much longer a hang guard waits in the sanitized build, where our code runs several times slower (the same
// factor as the CTest timeouts in tests/CMakeLists.txt): a limit that catches a hang, never one that times the work.
// 5: multi-process Gloo tests ran ~15x slower under ASan (CommProcessTest.EveryCollectiveWorld2: 66 s vs 4.4 s), so
// ×3 left World4's 100 s guard too little once other tests shared the two cores.
#ifdef DSCPP_SANITIZED
constexpr int kSanitizerSlowdown = 5;
#else
constexpr int kSanitizerSlowdown = 1;
#endif
}  // namespace dscpp::testing

#ifdef DSCPP_SANITIZED
#define DSCPP_SKIP_WHEN_SANITIZED(why) GTEST_SKIP() << "not under AddressSanitizer: " << why
#else
#define DSCPP_SKIP_WHEN_SANITIZED(why) static_cast<void>(0)
#endif
