// HF GPT-2 interop through an engine in this process: a file laid out as HF writes GPT-2 (Conv1D weights, the
// "transformer." prefix, mask buffers, the tied lm_head) loads into our GPT, and `consolidate --format hf-gpt2`
// writes our weights back in that layout, with a config.json, so the two directions are inverses.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../common/subprocess.h"
#include "dscpp/dscpp.h"
#include "model/gpt.h"

namespace dscpp::testing {
namespace {

namespace fs = std::filesystem;

gpt::GptConfig small_gpt() {
  gpt::GptConfig c;
  c.vocab_size = 64;
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  return c;
}

std::unique_ptr<Engine> make_engine(gpt::Gpt& model, int stage) {
  const auto config = Config::from_string(
      R"({"train_batch_size": 2, "zero_optimization": {"stage": )" + std::to_string(stage) +
      R"(, "stage3_param_persistence_threshold": 0}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}})");
  InitOptions init;
  init.comm = make_single_process_comm();
  init.log = [](const std::string&) {};
  for (const auto& block : model->blocks()) init.gather_units.push_back(block.ptr());
  return initialize(model.ptr(), config, init);
}

std::map<std::string, torch::Tensor> engine_weights(Engine& engine) {
  std::map<std::string, torch::Tensor> out;
  engine.visit_parameters([&](const std::string& name, const torch::Tensor& value) { out[name] = value.clone(); });
  return out;
}

// Writes `source`'s parameters as HF's GPT2LMHeadModel.save_pretrained lays them out.
void write_hf_style(gpt::Gpt& source, const std::string& path) {
  std::vector<TensorInfo> infos;
  std::vector<std::pair<std::string, torch::Tensor>> values;
  for (const auto& item : source->named_parameters()) {
    auto value = item.value().detach();
    if (is_hf_gpt2_conv1d_weight(item.key())) value = value.t().contiguous();
    values.emplace_back("transformer." + item.key(), value);
  }
  for (int64_t i = 0; i < source->config().n_layer; ++i) {
    values.emplace_back("transformer.h." + std::to_string(i) + ".attn.bias", torch::ones({1, 1, 16, 16}));
  }
  values.emplace_back("lm_head.weight", source->wte->weight.detach());
  for (const auto& [name, value] : values) infos.push_back({name, value.scalar_type(), value.sizes().vec()});
  SafetensorsWriter writer(path, infos, {{"format", "pt"}});
  for (const auto& [name, value] : values) writer.write(name, value);
  writer.close();
}

// An index that names a file outside its directory is refused before anything is opened.
TEST(HfGpt2, AnIndexNamingFilesElsewhereIsRefused) {
  const auto dir = temp_dir("hf_index_escape");
  for (const std::string& file : {std::string("\"../outside.safetensors\""), std::string("\"/etc/passwd\""),
                                  std::string("\".hidden\""), std::string("7")}) {
    std::ofstream(dir / "model.safetensors.index.json") << "{\"weight_map\": {\"wte.weight\": " + file + "}}";
    std::string error;
    try {
      HfGpt2Weights weights(dir.string());
    } catch (const std::exception& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("model.safetensors.index.json: weight_map[\"wte.weight\"] is " + file +
                         "; it must be the name of a file beside the index"), std::string::npos) << error;
  }
}

TEST(HfGpt2, HfLayoutLoadsIntoOurModelOnEveryStage) {
  torch::manual_seed(1);
  gpt::Gpt source(small_gpt());
  const auto dir = temp_dir("hf_gpt2_in");
  const auto path = (dir / "model.safetensors").string();
  write_hf_style(source, path);
  const HfGpt2Weights weights(path);
  EXPECT_EQ(weights.names().size(), source->named_parameters().size());  // buffers and lm_head left out
  for (int stage : {0, 3}) {
    torch::manual_seed(2);  // other initial values
    gpt::Gpt target(small_gpt());
    auto engine = make_engine(target, stage);
    engine->load_weights([&](const std::string& name, const std::vector<int64_t>& shape) {
      return weights.read(name, shape);
    });
    const auto loaded = engine_weights(*engine);
    for (const auto& item : source->named_parameters()) {
      EXPECT_TRUE(torch::equal(loaded.at(item.key()), item.value())) << "stage " << stage << " " << item.key();
    }
  }
  // A model of another width is a clear error naming the parameter and both shapes.
  try {
    weights.read("h.0.mlp.c_fc.weight", {64, 16});
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'h.0.mlp.c_fc.weight' is [128, 32]"), std::string::npos)
        << e.what();
  }
}

TEST(HfGpt2, ConsolidatedHfWeightsRoundTripAndCarryAConfig) {
  torch::manual_seed(3);
  gpt::Gpt model(small_gpt());
  auto engine = make_engine(model, 2);
  const auto dir = temp_dir("hf_gpt2_out");
  const nlohmann::json client = {{"gpt2", {{"vocab_size", 64}, {"block_size", 16}, {"n_embd", 32}, {"n_layer", 2},
                                           {"n_head", 2}, {"layer_norm_eps", 1e-5}}}};
  engine->save_checkpoint((dir / "ckpt").string(), "", client);
  ConsolidateOptions options;
  options.format = WeightsFormat::kHfGpt2;
  options.max_shard_bytes = 20'000;  // several files and an index
  const auto result = consolidate((dir / "ckpt").string(), (dir / "hf").string(), options);
  ASSERT_TRUE(fs::exists(dir / "hf" / "model.safetensors.index.json"));
  const auto config = nlohmann::json::parse(read_text(dir / "hf" / "config.json"));
  EXPECT_EQ(config["model_type"], "gpt2");
  EXPECT_EQ(config["n_head"], 2);
  EXPECT_EQ(config["n_positions"], 16);

  const auto ours = engine_weights(*engine);
  std::map<std::string, torch::Tensor> stored;
  for (const auto& file : result.files) {
    if (file.find(".safetensors") == std::string::npos || file.find(".json") != std::string::npos) continue;
    for (auto& [name, value] : read_safetensors((dir / "hf" / file).string())) stored[name] = value;
  }
  ASSERT_EQ(stored.size(), ours.size());
  // HF's Conv1D layout: (in, out).
  EXPECT_EQ(stored.at("h.0.attn.c_attn.weight").sizes(), (std::vector<int64_t>{32, 96}));
  EXPECT_TRUE(torch::equal(stored.at("h.1.mlp.c_proj.weight"), ours.at("h.1.mlp.c_proj.weight").t()));
  EXPECT_TRUE(torch::equal(stored.at("wte.weight"), ours.at("wte.weight")));
  // And back: the directory (sharded, with its index) loads into a fresh model as the same weights.
  torch::manual_seed(4);
  gpt::Gpt again(small_gpt());
  auto engine2 = make_engine(again, 1);
  const HfGpt2Weights weights((dir / "hf").string());
  engine2->load_weights([&](const std::string& name, const std::vector<int64_t>& shape) {
    return weights.read(name, shape);
  });
  for (const auto& [name, value] : engine_weights(*engine2)) EXPECT_TRUE(torch::equal(value, ours.at(name))) << name;
}

}  // namespace
}  // namespace dscpp::testing
