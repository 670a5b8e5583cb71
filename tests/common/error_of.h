// error_of: what a call throws, for tests that check an error's message.
#pragma once

#include <exception>
#include <string>

namespace dscpp::testing {

// The message of the `E` that fn() throws, or "(no error)". An exception of another type propagates, so the test
// fails on it rather than matching its message.
template <typename E = std::exception, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace dscpp::testing
