// TokenDataset: text bytes, llm.c .bin, raw uint16 .bin, the embedded corpus, and errors naming the file.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/token_dataset.h"

namespace gpt {
namespace {

namespace fs = std::filesystem;

class TokenDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("gpt_data_test_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const auto path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  static std::string int32s(const std::vector<int32_t>& values) {
    std::string s;
    for (const auto v : values) {
      for (int b = 0; b < 4; ++b) s.push_back(static_cast<char>((static_cast<uint32_t>(v) >> (8 * b)) & 0xff));
    }
    return s;
  }
  static std::string uint16s(const std::vector<uint16_t>& values) {
    std::string s;
    for (const auto v : values) {
      s.push_back(static_cast<char>(v & 0xff));
      s.push_back(static_cast<char>(v >> 8));
    }
    return s;
  }
  static std::string llmc_header(int32_t version, int32_t count) {
    std::vector<int32_t> header(256, 0);
    header[0] = TokenDataset::kLlmcMagic;
    header[1] = version;
    header[2] = count;
    return int32s(header);
  }
  // The message of the std::invalid_argument `f` throws; fails the test if none.
  template <typename F>
  static std::string error_of(F&& f) {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    ADD_FAILURE() << "no std::invalid_argument thrown";
    return "";
  }

  fs::path dir_;
};

TEST_F(TokenDatasetTest, TextFileIsOneTokenPerByte) {
  const auto path = write("notes.txt", std::string("Hi\n\xff\x00!", 6));
  const auto data = TokenDataset::from_file(path);
  EXPECT_EQ(data.vocab_size(), 256);
  EXPECT_EQ(data.tokens(), (std::vector<uint16_t>{'H', 'i', '\n', 255, 0, '!'}));
  EXPECT_EQ(data.num_tokens(), 6);
  EXPECT_EQ(data.description(), "text bytes from " + path + " (6 tokens)");
}

TEST_F(TokenDatasetTest, LlmcBinReadsHeaderCountAndGpt2Vocab) {
  const std::vector<uint16_t> tokens = {50256, 0, 1, 300, 65, 50255, 7};
  // Two trailing tokens beyond the header's count are ignored: the header is authoritative.
  const auto path = write("train.bin", llmc_header(1, 5) + uint16s(tokens));
  const auto data = TokenDataset::from_file(path);
  EXPECT_EQ(data.vocab_size(), 50257);
  EXPECT_EQ(data.tokens(), (std::vector<uint16_t>{50256, 0, 1, 300, 65}));
  EXPECT_NE(data.description().find("llm.c"), std::string::npos);
  EXPECT_NE(data.description().find(path), std::string::npos);
  // Version 2 is accepted as the same uint16 layout; the magic is recognized whatever the extension.
  EXPECT_EQ(TokenDataset::from_file(write("v2.tokens", llmc_header(2, 3) + uint16s({9, 8, 7}))).tokens(),
            (std::vector<uint16_t>{9, 8, 7}));
}

TEST_F(TokenDatasetTest, RawUint16BinRoundsVocabUpTo64) {
  const auto path = write("raw.bin", uint16s({3, 300, 2, 299}));
  const auto data = TokenDataset::from_file(path);
  EXPECT_EQ(data.tokens(), (std::vector<uint16_t>{3, 300, 2, 299}));
  EXPECT_EQ(data.vocab_size(), 320);  // 301 rounded up to a multiple of 64
  EXPECT_NE(data.description().find(path), std::string::npos);
  EXPECT_EQ(TokenDataset::from_file(write("gpt2.bin", uint16s({50256, 1}))).vocab_size(), 50304);
  EXPECT_EQ(TokenDataset::from_file(write("exact.bin", uint16s({63}))).vocab_size(), 64);
}

TEST_F(TokenDatasetTest, EveryFileErrorNamesTheFile) {
  const auto missing = (dir_ / "nope.txt").string();
  EXPECT_NE(error_of([&] { TokenDataset::from_file(missing); }).find(missing), std::string::npos);

  const auto empty = write("empty.txt", "");
  auto msg = error_of([&] { TokenDataset::from_file(empty); });
  EXPECT_NE(msg.find(empty), std::string::npos) << msg;
  EXPECT_NE(msg.find("empty"), std::string::npos) << msg;

  const auto truncated = write("trunc.bin", llmc_header(1, 4).substr(0, 100));
  msg = error_of([&] { TokenDataset::from_file(truncated); });
  EXPECT_NE(msg.find(truncated), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated llm.c header"), std::string::npos) << msg;

  const auto short_body = write("short.bin", llmc_header(1, 10) + uint16s({1, 2, 3}));
  msg = error_of([&] { TokenDataset::from_file(short_body); });
  EXPECT_NE(msg.find(short_body), std::string::npos) << msg;
  EXPECT_NE(msg.find("10 tokens but the file holds only 3"), std::string::npos) << msg;

  const auto bad_version = write("v9.bin", llmc_header(9, 1) + uint16s({1}));
  msg = error_of([&] { TokenDataset::from_file(bad_version); });
  EXPECT_NE(msg.find(bad_version), std::string::npos) << msg;
  EXPECT_NE(msg.find("version 9"), std::string::npos) << msg;

  const auto big_token = write("big.bin", llmc_header(1, 2) + uint16s({1, 50257}));
  msg = error_of([&] { TokenDataset::from_file(big_token); });
  EXPECT_NE(msg.find(big_token), std::string::npos) << msg;
  EXPECT_NE(msg.find("50257"), std::string::npos) << msg;

  const auto odd = write("odd.bin", "abc");
  msg = error_of([&] { TokenDataset::from_file(odd); });
  EXPECT_NE(msg.find(odd), std::string::npos) << msg;
  EXPECT_NE(msg.find("odd byte count"), std::string::npos) << msg;

  EXPECT_NE(error_of([&] { TokenDataset::from_file(dir_.string()); }).find(dir_.string()), std::string::npos);
}

TEST_F(TokenDatasetTest, ConstructorChecksTokensAgainstVocab) {
  EXPECT_EQ(TokenDataset({1, 2, 9}, 10, "mine").num_tokens(), 3);
  const auto msg = error_of([] { TokenDataset({1, 10}, 10, "my tokens"); });
  EXPECT_NE(msg.find("my tokens"), std::string::npos) << msg;
}

TEST(DefaultCorpus, IsEmbeddedEnglishText) {
  const auto data = TokenDataset::default_corpus();
  EXPECT_GT(data.num_tokens(), 50 * 1024);
  EXPECT_EQ(data.vocab_size(), 256);
  const std::string text(data.tokens().begin(), data.tokens().end());
  EXPECT_NE(text.find("GNU GENERAL PUBLIC LICENSE"), std::string::npos);
  EXPECT_NE(text.find("Apache License"), std::string::npos);
  EXPECT_NE(data.description().find("embedded default corpus"), std::string::npos) << data.description();
  EXPECT_NE(data.description().find(std::to_string(data.num_tokens()) + " bytes"), std::string::npos);
}

}  // namespace
}  // namespace gpt
