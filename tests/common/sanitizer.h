// Tests that measure a process's memory (peak RSS) mean nothing under AddressSanitizer: its shadow memory and the
// quarantine that holds freed blocks back grow RSS by design. scripts/test.sh --sanitize builds with DSCPP_SANITIZED;
// those tests skip there, saying why, and run in every other build.
#pragma once

#include <gtest/gtest.h>

#ifdef DSCPP_SANITIZED
#define DSCPP_SKIP_WHEN_SANITIZED(what) \
  GTEST_SKIP() << what << " is not measurable under AddressSanitizer (shadow memory and its quarantine grow RSS)"
#else
#define DSCPP_SKIP_WHEN_SANITIZED(what) static_cast<void>(0)
#endif
