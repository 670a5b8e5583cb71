// Counts written the way people say them: "1.5e9", "124M", "1.5B", "350k" → an integer.
#pragma once

#include <cstdint>
#include <string>

namespace dscpp {

// Accepts a plain number (integer or float notation) optionally followed by K, M, B/G or T (case-insensitive,
// powers of 1000). Throws std::invalid_argument naming the text when it is not a non-negative whole count.
int64_t parse_count(const std::string& text);

}  // namespace dscpp
