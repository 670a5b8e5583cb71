// Tests that measure a process's memory (peak RSS) mean nothing under AddressSanitizer: its shadow memory and the
// quarantine that holds freed blocks back grow RSS by design. scripts/test.sh --sanitize builds with DSCPP_SANITIZED;
// those tests skip there, saying why, and run in every other build.
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
#define DSCPP_SKIP_WHEN_SANITIZED(what) \
  GTEST_SKIP() << what << " is not measurable under AddressSanitizer (shadow memory and its quarantine grow RSS)"
#else
#define DSCPP_SKIP_WHEN_SANITIZED(what) static_cast<void>(0)
#endif
