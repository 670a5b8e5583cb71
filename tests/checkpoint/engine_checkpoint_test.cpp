// Engine::save_checkpoint / load_checkpoint in one process: what the manifest carries besides the weights
// (generator state, client state), load options, and calls at the wrong moment. Counters and optimizer state are
// covered by the exact-resume runs in checkpoint_process_test.cpp.
#include <gtest/gtest.h>

#include <filesystem>

#include "../common/subprocess.h"
#include "../common/test_device.h"
#include "dscpp/checkpoint/manifest.h"
#include "dscpp/dscpp.h"

namespace dscpp::testing {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Engine> make_engine(const std::string& optimizer, int grad_accum = 1) {
  auto model = std::make_shared<torch::nn::LinearImpl>(8, 4);
  model->to(test_device());
  const auto config = Config::from_string(R"({"train_batch_size": )" + std::to_string(2 * grad_accum) +
                                          R"(, "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": ")" +
                                          optimizer + R"(", "params": {"lr": 0.1}}})");
  InitOptions init;
  init.comm = make_single_process_comm();
  init.log = [](const std::string&) {};
  return initialize(model, config, init);
}

// The CPU generator always; the GPU's too when training on one (dropout there draws from it).
TEST(EngineCheckpoint, RestoresGeneratorsAndClientState) {
  const auto dir = temp_dir("engine_checkpoint");
  const auto device = test_device();
  auto engine = make_engine("AdamW");
  torch::manual_seed(7);
  const auto path = engine->save_checkpoint((dir / "ckpt").string(), "mine", {{"epoch", 4}, {"note", "x"}});
  EXPECT_EQ(path, (dir / "ckpt" / "mine").string());
  const auto shard = Manifest::read(path).files.at(0).tensor_crc32;
  EXPECT_EQ(shard.count(kRngTensor), 1u);
  EXPECT_EQ(shard.count(kRngCudaTensor), device.is_cuda() ? 1u : 0u);
  // What the generators give right after the save; then move them on.
  const auto expected = torch::rand({5});
  const auto expected_device = torch::rand({5}, torch::TensorOptions().device(device));
  torch::rand({100});
  torch::rand({100}, torch::TensorOptions().device(device));
  auto other = make_engine("AdamW");
  const auto loaded = other->load_checkpoint((dir / "ckpt").string());
  EXPECT_EQ(loaded.tag, "mine");
  EXPECT_EQ(loaded.client_state["epoch"], 4);
  EXPECT_TRUE(torch::equal(torch::rand({5}), expected));
  if (device.is_cuda()) {
    EXPECT_TRUE(torch::equal(torch::rand({5}, torch::TensorOptions().device(device)), expected_device));
  }
}

TEST(EngineCheckpoint, OptimizerMismatchNeedsLoadOptimizerStatesFalse) {
  const auto dir = temp_dir("engine_checkpoint_optimizer");
  auto adam = make_engine("AdamW");
  adam->save_checkpoint((dir / "ckpt").string());
  auto sgd = make_engine("SGD");
  try {
    sgd->load_checkpoint((dir / "ckpt").string());
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer AdamW (state: exp_avg, exp_avg_sq) cannot be loaded into SGD"),
              std::string::npos)
        << e.what();
  }
  CheckpointLoadOptions weights_only;
  weights_only.load_optimizer_states = false;
  EXPECT_NO_THROW(sgd->load_checkpoint((dir / "ckpt").string(), "", weights_only));
}

TEST(EngineCheckpoint, SaveAndLoadOnlyAtAnAccumulationBoundary) {
  const auto dir = temp_dir("engine_checkpoint_boundary");
  auto engine = make_engine("AdamW", /*grad_accum=*/2);
  engine->save_checkpoint((dir / "ckpt").string());
  EXPECT_THROW(engine->save_checkpoint((dir / "ckpt").string(), "../escape"), CheckpointError);
  auto model_loss = [&] { return torch::ones({1}, torch::requires_grad()).sum(); };
  engine->backward(engine->forward(model_loss));
  engine->step();  // micro-step 1 of 2
  for (auto* what : {"save", "load"}) {
    try {
      if (std::string(what) == "save") engine->save_checkpoint((dir / "ckpt").string());
      else engine->load_checkpoint((dir / "ckpt").string());
      FAIL() << what << ": no error";
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find("inside an accumulation of 2"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dscpp::testing
