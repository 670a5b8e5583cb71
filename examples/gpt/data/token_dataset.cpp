// TokenDataset: file format detection and reading, with errors that name the file.
#include "data/token_dataset.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace gpt {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::invalid_argument("--data '" + path + "': " + what);
}

std::string read_all(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, "no such file");
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory, expected a text or .bin file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot be opened for reading");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(path, "read error");
  return bytes;
}

// Little-endian decode (the llm.c and numpy writers' byte order), independent of the host's.
int32_t int32_at(const std::string& bytes, size_t offset) {
  uint32_t v = 0;
  for (int b = 3; b >= 0; --b) v = (v << 8) | static_cast<unsigned char>(bytes[offset + b]);
  return static_cast<int32_t>(v);
}

std::vector<uint16_t> uint16_tokens(const std::string& bytes, size_t offset, size_t count) {
  std::vector<uint16_t> tokens(count);
  for (size_t i = 0; i < count; ++i) {
    const auto lo = static_cast<unsigned char>(bytes[offset + 2 * i]);
    const auto hi = static_cast<unsigned char>(bytes[offset + 2 * i + 1]);
    tokens[i] = static_cast<uint16_t>(lo | (hi << 8));
  }
  return tokens;
}

TokenDataset read_llmc(const std::string& path, const std::string& bytes) {
  const size_t header_bytes = TokenDataset::kLlmcHeaderInts * sizeof(int32_t);
  if (bytes.size() < header_bytes) {
    fail(path, "truncated llm.c header: the file has " + std::to_string(bytes.size()) + " bytes, the header needs " +
                   std::to_string(header_bytes));
  }
  const int32_t version = int32_at(bytes, 4);
  if (version != 1 && version != 2) {
    fail(path, "llm.c header version " + std::to_string(version) + " is not supported (allowed: 1, 2 — uint16 GPT-2 tokens)");
  }
  const int32_t count = int32_at(bytes, 8);
  const size_t available = (bytes.size() - header_bytes) / 2;
  if (count <= 0) fail(path, "llm.c header says " + std::to_string(count) + " tokens; expected a positive count");
  if (static_cast<size_t>(count) > available) {
    fail(path, "llm.c header says " + std::to_string(count) + " tokens but the file holds only " +
                   std::to_string(available) + " (truncated file?)");
  }
  auto tokens = uint16_tokens(bytes, header_bytes, static_cast<size_t>(count));
  const auto max_token = *std::max_element(tokens.begin(), tokens.end());
  if (max_token >= TokenDataset::kGpt2VocabSize) {
    fail(path, "token " + std::to_string(max_token) + " is outside the GPT-2 vocabulary (50257)");
  }
  return TokenDataset(std::move(tokens), TokenDataset::kGpt2VocabSize,
                      "llm.c GPT-2 tokens from " + path + " (" + std::to_string(count) + " tokens)");
}

TokenDataset read_raw_uint16(const std::string& path, const std::string& bytes) {
  if (bytes.size() % 2 != 0) {
    fail(path, "a raw .bin holds uint16 tokens, but the file has an odd byte count (" + std::to_string(bytes.size()) +
                   "); use another extension to read it as text");
  }
  auto tokens = uint16_tokens(bytes, 0, bytes.size() / 2);
  const int64_t max_token = *std::max_element(tokens.begin(), tokens.end());
  const int64_t m = TokenDataset::kRawVocabMultiple;
  const int64_t vocab = (max_token + 1 + m - 1) / m * m;
  const auto n = std::to_string(tokens.size());
  return TokenDataset(std::move(tokens), vocab,
                      "raw uint16 tokens from " + path + " (" + n + " tokens, vocab " + std::to_string(vocab) + ")");
}

}  // namespace

TokenDataset::TokenDataset(std::vector<uint16_t> tokens, int64_t vocab_size, std::string description)
    : tokens_(std::move(tokens)), vocab_size_(vocab_size), description_(std::move(description)) {
  if (vocab_size_ <= 0 || vocab_size_ > 65536) {
    throw std::invalid_argument(description_ + ": vocab_size " + std::to_string(vocab_size_) +
                                " must be in [1, 65536] for uint16 tokens");
  }
  for (const auto t : tokens_) {
    if (t >= vocab_size_) {
      throw std::invalid_argument(description_ + ": token " + std::to_string(t) + " is not below vocab_size " +
                                  std::to_string(vocab_size_));
    }
  }
}

TokenDataset TokenDataset::from_file(const std::string& path) { return from_bytes(path, read_all(path)); }

TokenDataset TokenDataset::from_bytes(const std::string& path, const std::string& bytes) {
  if (bytes.empty()) fail(path, "file is empty");
  if (bytes.size() >= sizeof(int32_t) && int32_at(bytes, 0) == kLlmcMagic) return read_llmc(path, bytes);
  if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".bin") == 0) return read_raw_uint16(path, bytes);
  const auto n = std::to_string(bytes.size());
  return from_text(bytes, "text bytes from " + path + " (" + n + " tokens)");
}

TokenDataset TokenDataset::from_text(std::string_view bytes, std::string description) {
  std::vector<uint16_t> tokens(bytes.size());
  // Through unsigned char: a byte ≥ 0x80 is token 128–255, never a sign-extended 65k.
  std::transform(bytes.begin(), bytes.end(), tokens.begin(),
                 [](char c) { return static_cast<uint16_t>(static_cast<unsigned char>(c)); });
  return TokenDataset(std::move(tokens), kByteVocabSize, std::move(description));
}

}  // namespace gpt
