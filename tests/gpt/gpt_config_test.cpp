// GptConfig: presets, the exact GPT-2 parameter count, and errors that name the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "model/gpt.h"
#include "model/gpt_config.h"

namespace gpt {
namespace {

int64_t count_parameters(torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<no std::invalid_argument thrown>";
}

TEST(GptConfig, Gpt2ParamCountIsHfGpt2Small) {
  const auto config = GptConfig::preset("gpt2", 50257);
  EXPECT_EQ(config.num_params(), 124439808);  // HF GPT2Model / GPT2LMHeadModel (tied head)
  Gpt model(config);
  EXPECT_EQ(count_parameters(*model), 124439808);
}

TEST(GptConfig, NumParamsMatchesModelForEveryShape) {
  for (const auto& config : {GptConfig::preset("tiny", 256), GptConfig::preset("small", 256),
                             GptConfig{/*vocab*/ 97, /*block*/ 33, /*layers*/ 3, /*heads*/ 5, /*embd*/ 40}}) {
    Gpt model(config);
    EXPECT_EQ(count_parameters(*model), config.num_params());
  }
}

TEST(GptConfig, PresetShapes) {
  struct Expected { const char* name; int64_t layers, heads, embd, block; };
  for (const auto& e : {Expected{"gpt2", 12, 12, 768, 1024}, Expected{"gpt2-medium", 24, 16, 1024, 1024},
                        Expected{"gpt2-large", 36, 20, 1280, 1024}, Expected{"gpt2-xl", 48, 25, 1600, 1024}}) {
    const auto c = GptConfig::preset(e.name, 50257);
    EXPECT_EQ(c.n_layer, e.layers) << e.name;
    EXPECT_EQ(c.n_head, e.heads) << e.name;
    EXPECT_EQ(c.n_embd, e.embd) << e.name;
    EXPECT_EQ(c.block_size, e.block) << e.name;
    EXPECT_EQ(c.vocab_size, 50257);
    EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-5);
  }
  // HF's published sizes (tied head): medium 354.8M, large 774.0M, xl 1557.6M.
  EXPECT_EQ(GptConfig::preset("gpt2-medium", 50257).num_params(), 354823168);
  EXPECT_EQ(GptConfig::preset("gpt2-large", 50257).num_params(), 774030080);
  EXPECT_EQ(GptConfig::preset("gpt2-xl", 50257).num_params(), 1557611200);
  // Size classes of the small presets with byte vocabulary.
  const auto tiny = GptConfig::preset("tiny", 256).num_params();
  const auto small = GptConfig::preset("small", 256).num_params();
  EXPECT_GT(tiny, 500000);
  EXPECT_LT(tiny, 2000000);
  EXPECT_GT(small, 3 * tiny);
}

TEST(GptConfig, UnknownPresetListsKnownNames) {
  const auto msg = error_of([] { GptConfig::preset("gpt3", 256); });
  EXPECT_NE(msg.find("--model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'gpt3'"), std::string::npos) << msg;
  for (const auto& name : GptConfig::preset_names()) EXPECT_NE(msg.find(name), std::string::npos) << msg;
  EXPECT_EQ(GptConfig::preset_names().size(), 6u);
}

TEST(GptConfig, IndivisibleHeadsNameBothFlags) {
  GptConfig c;
  c.n_embd = 100;
  c.n_head = 3;
  const auto msg = error_of([&] { c.validate(); });
  EXPECT_NE(msg.find("--n_embd 100"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--n_head 3"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { Gpt model(c); }).find("--n_head"), std::string::npos);
}

TEST(GptConfig, NonPositiveFieldsNameTheFlag) {
  GptConfig c;
  c.n_layer = 0;
  EXPECT_NE(error_of([&] { c.validate(); }).find("--n_layer"), std::string::npos);
  c = GptConfig{};
  c.n_head = -1;
  EXPECT_NE(error_of([&] { c.validate(); }).find("--n_head"), std::string::npos);
  c = GptConfig{};
  c.vocab_size = 0;
  EXPECT_NE(error_of([&] { c.validate(); }).find("vocab_size"), std::string::npos);
}

}  // namespace
}  // namespace gpt
