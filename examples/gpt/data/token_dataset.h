// TokenDataset: a token stream held in memory — text as bytes, an llm.c .bin, a raw uint16 .bin, or the embedded
// default corpus. Knows its vocabulary size; BatchSampler cuts it into training windows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

class TokenDataset {
 public:
  // llm.c's token file header: 256 int32, [0] magic, [1] version, [2] token count; uint16 tokens follow.
  static constexpr int32_t kLlmcMagic = 20240520;
  static constexpr int64_t kLlmcHeaderInts = 256;
  static constexpr int64_t kGpt2VocabSize = 50257;
  static constexpr int64_t kByteVocabSize = 256;
  static constexpr int64_t kRawVocabMultiple = 64;

  // Reads the whole file, choosing the format by content and name:
  //   - starts with the llm.c magic: llm.c GPT-2 tokens (version 1 or 2), vocab 50257; the header's count is
  //     authoritative (trailing bytes are ignored);
  //   - else a name ending in ".bin": raw little-endian uint16 tokens, vocab = (max token + 1) rounded up to a
  //     multiple of 64 (50257 → 50304, the padded GPT-2 vocab);
  //   - anything else: text, one token per byte, vocab 256.
  // Throws std::invalid_argument naming the file when it is missing, empty, has a truncated header, claims more
  // tokens than it holds, has an odd byte count (raw .bin) or a token ≥ 50257 (llm.c).
  static TokenDataset from_file(const std::string& path);

  // The corpus compiled into the binary (license texts from /usr/share/common-licenses, as bytes): no file needed.
  static TokenDataset default_corpus();

  // Any token stream; each token must be < vocab_size.
  TokenDataset(std::vector<uint16_t> tokens, int64_t vocab_size, std::string description);

  int64_t vocab_size() const { return vocab_size_; }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<uint16_t>& tokens() const { return tokens_; }
  // What and where, e.g. "text bytes from data.txt (1234 tokens)"; error messages downstream quote it.
  const std::string& description() const { return description_; }

 private:
  std::vector<uint16_t> tokens_;  // (num_tokens)
  int64_t vocab_size_;
  std::string description_;
};

}  // namespace gpt
