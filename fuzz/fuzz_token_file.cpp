// gpt-train's --data file: an llm.c .bin (magic, version, token count, then uint16 tokens), a raw uint16 .bin, or
// text. Crafted bytes must end in a dataset whose every token is below its vocabulary, or std::invalid_argument.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "data/token_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  // The first byte picks the name, so both the ".bin" rule and the text path are reached from one corpus.
  const std::string path = size > 0 && (data[0] & 1) ? "tokens.txt" : "tokens.bin";
  try {
    const auto dataset = gpt::TokenDataset::from_bytes(path, bytes);
    if (dataset.num_tokens() <= 0 || dataset.vocab_size() <= 0 || dataset.vocab_size() > 65536) __builtin_trap();
    for (const auto t : dataset.tokens()) {
      if (t >= dataset.vocab_size()) __builtin_trap();
    }
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()).find(path) == std::string::npos) __builtin_trap();  // every error names the file
  }
  return 0;
}
