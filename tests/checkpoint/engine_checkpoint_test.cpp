// Engine::save_checkpoint / load_checkpoint in one process: what the manifest carries besides the weights
// (generator state, client state), load options, and calls at the wrong moment. Counters and optimizer state are
// covered by the exact-resume runs in checkpoint_process_test.cpp.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <filesystem>

#include "../common/error_of.h"
#include "../common/subprocess.h"
#include "../common/test_device.h"
#include "dscpp/checkpoint/checkpoint_dir.h"
#include "dscpp/checkpoint/consolidate.h"
#include "dscpp/checkpoint/manifest.h"
#include "dscpp/checkpoint/safetensors.h"
#include "dscpp/dscpp.h"

namespace dscpp::testing {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Engine> make_engine(const std::string& optimizer, int grad_accum = 1,
                                    std::shared_ptr<torch::nn::Module> model = nullptr,
                                    const std::string& scheduler = "") {
  if (!model) model = std::make_shared<torch::nn::LinearImpl>(8, 4);
  model->to(test_device());
  const auto config = Config::from_string(R"({"train_batch_size": )" + std::to_string(2 * grad_accum) +
                                          R"(, "train_micro_batch_size_per_gpu": 2, "optimizer": {"type": ")" +
                                          optimizer + R"(", "params": {"lr": 0.1}})" +
                                          (scheduler.empty() ? "" : ", \"scheduler\": " + scheduler) + "}");
  InitOptions init;
  init.comm = make_single_process_comm();
  init.log = [](const std::string&) {};
  return initialize(model, config, init);
}

// One optimizer step of `engine` over `model` on a fixed batch.
void train_step(Engine& engine, torch::nn::Module& model) {
  const auto x = torch::arange(16, torch::TensorOptions().dtype(torch::kFloat32).device(test_device())).view({2, 8});
  engine.backward(engine.forward([&] {
    torch::Tensor out = x;
    for (const auto& child : model.children()) out = child->as<torch::nn::Linear>()->forward(out);
    if (auto* linear = model.as<torch::nn::Linear>()) out = linear->forward(x);
    return out.pow(2).mean();
  }));
  engine.step();
}

// A Linear(8, width) named "fc", with or without a parameter "extra" beside it.
struct FcImpl : torch::nn::Module {
  FcImpl(int64_t width, bool extra) {
    fc = register_module("fc", torch::nn::Linear(8, width));
    if (extra) this->extra = register_parameter("extra", torch::full({3}, 5.0));
  }
  torch::nn::Linear fc{nullptr};
  torch::Tensor extra;
};

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
  const auto mismatch = error_of<CheckpointError>([&] { sgd->load_checkpoint((dir / "ckpt").string()); });
  EXPECT_NE(mismatch.find("optimizer AdamW (state: exp_avg, exp_avg_sq) cannot be loaded into SGD"), std::string::npos)
      << mismatch;
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
    const auto error = error_of<std::logic_error>([&] {
      if (std::string(what) == "save") engine->save_checkpoint((dir / "ckpt").string());
      else engine->load_checkpoint((dir / "ckpt").string());
    });
    EXPECT_NE(error.find("inside an accumulation of 2"), std::string::npos) << what << ": " << error;
  }
}

// A save that runs out of disk fails with the directory named, leaves `latest` and the last checkpoint as they were,
// and the engine trains and saves on. Two ways to fill a disk: a small tmpfs where this process may mount one (root),
// and everywhere a file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored so writes fail with EFBIG, as a full disk
// fails them with ENOSPC).
std::string save_error(Engine& engine, const std::string& dir, const std::function<void()>& fill) {
  fill();
  std::string error = "(no error)";
  try {
    engine.save_checkpoint(dir, "second");
  } catch (const CheckpointError& e) {
    error = e.what();
  } catch (const std::exception& e) {
    error = std::string("not a CheckpointError: ") + e.what();
  }
  return error;
}

TEST(EngineCheckpoint, AFullDiskFailsTheSaveKeepsTheLastCheckpointAndTrainingGoesOn) {
  const auto dir = temp_dir("engine_checkpoint_full");
  auto model = std::make_shared<FcImpl>(512, false);  // 4,608 parameters: a checkpoint of about 75 KB
  auto engine = make_engine("AdamW", 1, model);
  struct Disk {
    std::string name, dir;
    std::function<void()> fill, free;
    std::string error;  // errno text the save reports
  };
  std::vector<Disk> disks;
  const auto tmpfs = dir / "tmpfs";
  fs::create_directories(tmpfs);
  // 128 KiB: the first checkpoint fits, a second beside it does not.
  if (std::system(("mount -t tmpfs -o size=128k tmpfs " + tmpfs.string() + " 2>/dev/null").c_str()) == 0) {
    disks.push_back({"tmpfs", (tmpfs / "ckpt").string(), [] {},
                     [tmpfs] { [[maybe_unused]] int rc = std::system(("umount " + tmpfs.string()).c_str()); },
                     "No space left on device"});
  } else {
    std::cerr << "[ note ] cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN): RLIMIT_FSIZE only\n";
  }
  rlimit saved{};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  disks.push_back({"rlimit_fsize", (dir / "limited").string(),
                   [saved] {
                     std::signal(SIGXFSZ, SIG_IGN);
                     rlimit small = saved;
                     small.rlim_cur = 16 * 1024;
                     ::setrlimit(RLIMIT_FSIZE, &small);
                   },
                   [saved] {
                     ::setrlimit(RLIMIT_FSIZE, &saved);
                     std::signal(SIGXFSZ, SIG_DFL);
                   },
                   "File too large"});
  for (auto& disk : disks) {
    SCOPED_TRACE(disk.name);
    train_step(*engine, *model);
    engine->save_checkpoint(disk.dir, "first");
    const auto first = read_text(fs::path(disk.dir) / "first" / "rank_00000.safetensors");
    train_step(*engine, *model);
    const std::string error = save_error(*engine, disk.dir, disk.fill);
    EXPECT_NE(error.find(disk.dir), std::string::npos) << error;
    EXPECT_NE(error.find(disk.error), std::string::npos) << error;
    EXPECT_EQ(read_text(fs::path(disk.dir) / "latest"), "first\n");
    EXPECT_TRUE(read_text(fs::path(disk.dir) / "first" / "rank_00000.safetensors") == first);
    EXPECT_FALSE(fs::exists(fs::path(disk.dir) / "second"));
    // Nothing of the failed save is left taking the space a next save needs.
    const auto staging = fs::path(staging_dir(disk.dir, "second"));
    EXPECT_TRUE(!fs::exists(staging) || fs::is_empty(staging));
    disk.free();
    // Training goes on, and a save with room succeeds and loads.
    train_step(*engine, *model);
    const auto roomy = (dir / ("roomy_" + disk.name)).string();
    engine->save_checkpoint(roomy, "third");
    auto other = make_engine("AdamW", 1, std::make_shared<FcImpl>(512, false));
    EXPECT_EQ(other->load_checkpoint(roomy).tag, "third");
  }
}

// DeepSpeed's load_lr_scheduler_states=False: the step counters are the checkpoint's, the schedule keeps this
// engine's position (a new engine's warmup starts over), and the position a later save writes is that one.
TEST(EngineCheckpoint, WithoutSchedulerStatesTheScheduleKeepsThisEnginesPosition) {
  const auto dir = temp_dir("engine_checkpoint_schedule");
  const std::string warmup =
      R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.1, "warmup_num_steps": 10,
          "warmup_type": "linear"}})";
  auto model = std::make_shared<torch::nn::LinearImpl>(8, 4);
  auto engine = make_engine("AdamW", 1, model, warmup);
  const double lr0 = engine->lr();
  for (int i = 0; i < 3; ++i) train_step(*engine, *model);
  const double lr3 = engine->lr();
  ASSERT_NE(lr3, lr0);
  engine->save_checkpoint((dir / "ckpt").string(), "three");

  auto resumed = make_engine("AdamW", 1, nullptr, warmup);
  resumed->load_checkpoint((dir / "ckpt").string());
  EXPECT_EQ(resumed->global_steps(), 3);
  EXPECT_EQ(resumed->lr(), lr3);

  auto restarted_model = std::make_shared<torch::nn::LinearImpl>(8, 4);
  auto restarted = make_engine("AdamW", 1, restarted_model, warmup);
  train_step(*restarted, *restarted_model);  // this engine's own schedule stands at 1
  const double lr1 = restarted->lr();
  CheckpointLoadOptions keep_schedule;
  keep_schedule.load_lr_scheduler_states = false;
  restarted->load_checkpoint((dir / "ckpt").string(), "", keep_schedule);
  EXPECT_EQ(restarted->global_steps(), 3);
  EXPECT_EQ(restarted->lr(), lr1);
  train_step(*restarted, *restarted_model);  // ran at the kept position, and moved it to 2 (iteration 1)
  EXPECT_DOUBLE_EQ(restarted->lr(), 0.01);
  EXPECT_EQ(restarted->last_step().lr, restarted->lr());  // what the next step will use
  restarted->save_checkpoint((dir / "ckpt").string(), "four");
  EXPECT_EQ(Manifest::read((dir / "ckpt" / "four").string()).scheduler_position, 2);
  auto again = make_engine("AdamW", 1, nullptr, warmup);
  again->load_checkpoint((dir / "ckpt").string(), "four");
  EXPECT_EQ(again->global_steps(), 4);
  EXPECT_EQ(again->lr(), restarted->lr());
}

// DeepSpeed's load_module_only: the weights, and nothing of where training stood (nor an optimizer to match).
TEST(EngineCheckpoint, ModuleOnlyLoadsTheWeightsAlone) {
  const auto dir = temp_dir("engine_checkpoint_module_only");
  auto model = std::make_shared<torch::nn::LinearImpl>(8, 4);
  auto engine = make_engine("AdamW", 1, model);
  for (int i = 0; i < 2; ++i) train_step(*engine, *model);
  engine->save_checkpoint((dir / "ckpt").string());

  auto fresh_model = std::make_shared<torch::nn::LinearImpl>(8, 4);
  auto fresh = make_engine("SGD", 1, fresh_model);
  ASSERT_FALSE(torch::equal(fresh_model->weight, model->weight));
  CheckpointLoadOptions module_only;
  module_only.load_module_only = true;
  fresh->load_checkpoint((dir / "ckpt").string(), "", module_only);
  EXPECT_TRUE(torch::equal(fresh_model->weight, model->weight));
  EXPECT_TRUE(torch::equal(fresh_model->bias, model->bias));
  EXPECT_EQ(fresh->global_steps(), 0);
  EXPECT_EQ(fresh->global_samples(), 0);
  train_step(*fresh, *fresh_model);  // SGD steps from the loaded weights
  EXPECT_EQ(fresh->global_steps(), 1);
}

// load_module_strict = false, as torch's load_state_dict(strict=False): parameters only one side has are skipped
// (this model's keep their values), shared ones load; a shared one of another shape is still an error.
TEST(EngineCheckpoint, NonStrictLoadSkipsParametersOnlyOneSideHas) {
  const auto dir = temp_dir("engine_checkpoint_strict");
  auto saved_model = std::make_shared<FcImpl>(4, false);
  make_engine("AdamW", 1, saved_model)->save_checkpoint((dir / "plain").string());

  auto wider = std::make_shared<FcImpl>(4, true);
  auto engine = make_engine("AdamW", 1, wider);
  const auto strict = error_of<CheckpointError>([&] { engine->load_checkpoint((dir / "plain").string()); });
  EXPECT_NE(strict.find("this model has parameter 'extra', the checkpoint does not"), std::string::npos) << strict;
  EXPECT_NE(strict.find("load_module_strict"), std::string::npos) << strict;
  CheckpointLoadOptions lenient;
  lenient.load_module_strict = false;
  engine->load_checkpoint((dir / "plain").string(), "", lenient);
  EXPECT_TRUE(torch::equal(wider->fc->weight, saved_model->fc->weight));
  EXPECT_TRUE(torch::equal(wider->extra, torch::full({3}, 5.0, torch::TensorOptions().device(test_device()))));

  engine->save_checkpoint((dir / "extra").string());  // the other way: the checkpoint has one more
  auto narrow_model = std::make_shared<FcImpl>(4, false);
  EXPECT_THROW(make_engine("AdamW", 1, narrow_model)->load_checkpoint((dir / "extra").string()), CheckpointError);
  make_engine("AdamW", 1, narrow_model)->load_checkpoint((dir / "extra").string(), "", lenient);
  EXPECT_TRUE(torch::equal(narrow_model->fc->weight, saved_model->fc->weight));

  auto other_shape = make_engine("AdamW", 1, std::make_shared<FcImpl>(5, false));
  const auto shape =
      error_of<CheckpointError>([&] { other_shape->load_checkpoint((dir / "plain").string(), "", lenient); });
  EXPECT_NE(shape.find("parameter 'fc.weight' is [4, 8] there, [5, 8] here"), std::string::npos) << shape;
}

// A Linear(8, 4) beside a buffer and a frozen parameter, as a model with running statistics and a frozen part is.
struct StatefulImpl : torch::nn::Module {
  explicit StatefulImpl(int64_t running_size = 3) {
    fc = register_module("fc", torch::nn::Linear(8, 4));
    running = register_buffer("running", torch::zeros({running_size}));
    frozen = register_parameter("frozen", torch::ones({2}), /*requires_grad=*/false);
  }
  torch::nn::Linear fc{nullptr};
  torch::Tensor running, frozen;
};

// The module's buffers and frozen parameters are in the checkpoint (rank 0's, as DeepSpeed's module state), unless
// exclude_frozen_parameters leaves the frozen ones out; save_latest = false leaves `latest` where it was.
TEST(EngineCheckpoint, BuffersAndFrozenParametersTravelWithTheCheckpoint) {
  const auto dir = temp_dir("engine_checkpoint_module_state");
  auto saved_model = std::make_shared<StatefulImpl>();
  auto saved = make_engine("AdamW", 1, saved_model);
  {
    torch::NoGradGuard no_grad;
    saved_model->running.copy_(torch::tensor({1.5f, -2.0f, 7.0f}));
    saved_model->frozen.fill_(3.0f);
  }
  saved->save_checkpoint((dir / "ckpt").string(), "all");
  CheckpointSaveOptions options;
  options.exclude_frozen_parameters = true;
  options.save_latest = false;
  saved->save_checkpoint((dir / "ckpt").string(), "no_frozen", nullptr, options);
  EXPECT_EQ(read_text(dir / "ckpt" / "latest"), "all\n") << "save_latest = false left `latest` alone";
  const auto manifest = Manifest::read((dir / "ckpt" / "no_frozen").string());
  ASSERT_EQ(manifest.module_state.size(), 1u);
  EXPECT_EQ(manifest.module_state[0].name, "running");

  auto model = std::make_shared<StatefulImpl>();
  auto engine = make_engine("AdamW", 1, model);
  engine->load_checkpoint((dir / "ckpt").string());
  EXPECT_TRUE(torch::equal(model->running, saved_model->running));
  EXPECT_TRUE(torch::equal(model->frozen, saved_model->frozen));

  auto kept_model = std::make_shared<StatefulImpl>();
  make_engine("AdamW", 1, kept_model)->load_checkpoint((dir / "ckpt").string(), "no_frozen");
  EXPECT_TRUE(torch::equal(kept_model->running, saved_model->running));
  EXPECT_TRUE(torch::equal(kept_model->frozen, torch::ones({2}))) << "not in the checkpoint: its own value stays";

  // Consolidated, the weights are the whole state_dict: trained, buffer and frozen tensors, bf16 where floating.
  ConsolidateOptions bf16;
  bf16.dtype = torch::kBFloat16;
  consolidate((dir / "ckpt").string(), (dir / "weights").string(), bf16);
  SafetensorsReader weights((dir / "weights" / "model.safetensors").string());
  std::vector<std::string> names;
  for (const auto& t : weights.tensors()) names.push_back(t.info.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"fc.bias", "fc.weight", "frozen", "running"}));
  EXPECT_TRUE(torch::equal(weights.read("running"), saved_model->running.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(weights.read("frozen"), saved_model->frozen.to(torch::kBFloat16)));

  auto other = make_engine("AdamW", 1, std::make_shared<StatefulImpl>(5));
  const auto module = error_of<CheckpointError>([&] { other->load_checkpoint((dir / "ckpt").string()); });
  EXPECT_NE(module.find("module tensor 'running' is [3] Float there, [5] Float here"), std::string::npos) << module;
}

}  // namespace
}  // namespace dscpp::testing
