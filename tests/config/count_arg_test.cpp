// parse_count: the CLI's "124M" / "1.5B" / "1.5e9" parameter counts.
#include <gtest/gtest.h>

#include <stdexcept>

#include "count_arg.h"

namespace dscpp {
namespace {

TEST(ParseCount, SuffixesAndScientific) {
  EXPECT_EQ(parse_count("124M"), 124'000'000);
  EXPECT_EQ(parse_count("1.5B"), 1'500'000'000);
  EXPECT_EQ(parse_count("1.5e9"), 1'500'000'000);
  EXPECT_EQ(parse_count("350k"), 350'000);
  EXPECT_EQ(parse_count("7b"), 7'000'000'000);
  EXPECT_EQ(parse_count("1T"), 1'000'000'000'000);
  EXPECT_EQ(parse_count("1000"), 1000);
}

TEST(ParseCount, Rejects) {
  for (const char* bad : {"", "M", "abc", "-5", "1.5", "12X", "1e400"}) {
    EXPECT_THROW(parse_count(bad), std::invalid_argument) << bad;
  }
}

}  // namespace
}  // namespace dscpp
