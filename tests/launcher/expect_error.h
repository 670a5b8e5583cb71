// expect_error: the launcher tests compare whole error messages, since naming the file, line and flag is the point.
#pragma once

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace dscpp::launcher {

// Runs `fn`, expecting std::invalid_argument with exactly `message`.
template <typename Fn>
void expect_error(Fn fn, const std::string& message) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected: " << message;
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

}  // namespace dscpp::launcher
