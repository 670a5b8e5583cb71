// What the sanitized build (scripts/test.sh --sanitize, DSCPP_SANITIZED) changes for tests. A few tests mean nothing
// under AddressSanitizer and skip there, saying why: those that measure a process's memory (its shadow memory and the
// quarantine of freed blocks grow RSS by design) and those of glibc's malloc (ASan replaces malloc). They run in
// every other build.
#pragma once

#include <gtest/gtest.h>

namespace dscpp::testing {
// How much longer a hang guard waits in the sanitized build, where our code runs several times slower (as the CTest
// timeouts in tests/CMakeLists.txt): a limit that catches a hang, never one that times the work.
#ifdef DSCPP_SANITIZED
constexpr int kSanitizerSlowdown = 3;
#else
constexpr int kSanitizerSlowdown = 1;
#endif
}  // namespace dscpp::testing

#ifdef DSCPP_SANITIZED
#define DSCPP_SKIP_WHEN_SANITIZED(why) GTEST_SKIP() << "not under AddressSanitizer: " << why
#else
#define DSCPP_SKIP_WHEN_SANITIZED(why) static_cast<void>(0)
#endif
