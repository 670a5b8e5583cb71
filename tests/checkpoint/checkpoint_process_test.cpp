// Checkpoints over real gpt-train processes: exact resume on every stage and world size,
// resharding N → M and stage s → t, a save killed at every point of the protocol, damaged checkpoints, and
// consolidation (exact weights, peak memory measured, HF GPT-2 layout back into gpt-train).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "../common/multiprocess.h"
#include "../common/sanitizer.h"
#include "../common/test_device.h"
#include "dscpp/checkpoint/checkpoint_dir.h"
#include "dscpp/checkpoint/manifest.h"
#include "dscpp/checkpoint/safetensors.h"

namespace dscpp::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kSteps = 6;
constexpr int kSaveAt = 3;

struct Shape {
  int world = 1;
  int stage = 0;
  bool bf16 = false;
  int grad_accum = 1;
  std::string offload = "";  // offload_optimizer.device ("" = none), stepping in sub-groups of 7,001
  bool offload_params = false;  // stage 3: offload_param.device as `offload`
  std::string name() const {
    return "w" + std::to_string(world) + "s" + std::to_string(stage) + (bf16 ? "bf16" : "fp32") + "gas" +
           std::to_string(grad_accum) + (offload.empty() ? "" : "offload" + offload) +
           (offload_params ? "params" : "");
  }
};

std::string write_config(const fs::path& dir, const Shape& shape, const std::string& optimizer = "AdamW") {
  // Small buckets: the tiny model spans many groups, with padding in several. Stage 3 keeps the biases and norms
  // whole (its persistent group) and shards everything else.
  nlohmann::json zero = {{"stage", shape.stage}, {"reduce_bucket_size", 30011}, {"overlap_comm", true}};
  if (shape.stage == 3) {
    zero["stage3_param_persistence_threshold"] = 20'000;
    zero["stage3_gather_16bit_weights_on_model_save"] = true;
  }
  if (!shape.offload.empty()) {
    zero["offload_optimizer"] = {{"device", shape.offload}, {"nvme_path", dir.string()}};
    if (shape.offload_params) zero["offload_param"] = {{"device", shape.offload}, {"nvme_path", dir.string()}};
    zero["sub_group_size"] = 7'001;
  }
  nlohmann::json opt = optimizer == "SGD"
                           ? nlohmann::json{{"type", "SGD"}, {"params", {{"lr", 1e-2}}}}
                           : nlohmann::json{{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decay", 0.1}}}};
  const nlohmann::json config = {{"train_batch_size", 8},
                                 {"gradient_accumulation_steps", shape.grad_accum},
                                 {"steps_per_print", 1000},
                                 {"gradient_clipping", 1.0},
                                 {"bf16", {{"enabled", shape.bf16}}},
                                 {"zero_optimization", zero},
                                 {"optimizer", opt},
                                 {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 4},
                                                                               {"warmup_max_lr", 1e-3}}}}}};
  const auto path = dir / (shape.name() + "_" + optimizer + ".json");
  std::ofstream(path) << config.dump();
  return path.string();
}

struct Result {
  std::vector<CommandResult> ranks;
  std::vector<nlohmann::json> metrics;  // rank 0's, one per step this run took
  bool ok() const {
    for (const auto& r : ranks)
      if (r.code != 0) return false;
    return true;
  }
  std::string errors() const {
    std::string out;
    for (size_t r = 0; r < ranks.size(); ++r) {
      out += "rank " + std::to_string(r) + " (exit " + std::to_string(ranks[r].code) + "):\n" + ranks[r].err;
    }
    return out;
  }
};

// gpt-train tiny on `shape`, with `args` appended (and `env` before it).
Result gpt_train(const Shape& shape, const fs::path& dir, const std::string& args, const std::string& env = "") {
  static int run_id = 0;
  const auto metrics = dir / ("metrics_" + std::to_string(run_id++) + ".jsonl");
  const std::string command = gpt_train_command() + " --no_progress --model tiny --seq_len 32" +
                              " --data_order shuffled --deepspeed_config " + write_config(dir, shape) +
                              " --metrics " + metrics.string() + " " + args;
  Result result;
  result.ranks = run_ranks(shape.world, command, "OMP_NUM_THREADS=1 DEEPSPEED_TIMEOUT=20 " + env);
  std::istringstream in(read_text(metrics));
  for (std::string line; std::getline(in, line);) result.metrics.push_back(nlohmann::json::parse(line));
  return result;
}

std::string flag(const std::string& name, const fs::path& value) { return " --" + name + " " + value.string(); }

// ---- Exact resume: save at step 3, load in a new run, continue: identical to the run that never stopped. ----

void PrintTo(const Shape& shape, std::ostream* os) { *os << shape.name(); }  // not its bytes (ctest, failures)

class ExactResume : public ::testing::TestWithParam<Shape> {};

TEST_P(ExactResume, ContinuesBitwiseAsTheUninterruptedRun) {
  const Shape shape = GetParam();
  const auto dir = temp_dir("resume_" + shape.name());
  const auto full = gpt_train(shape, dir,
                              "--steps " + std::to_string(kSteps) + flag("save_dir", dir / "ckpt") +
                                  " --save_interval " + std::to_string(kSaveAt) + flag("save_16bit", dir / "full.st"));
  ASSERT_TRUE(full.ok()) << full.errors();
  ASSERT_EQ(full.metrics.size(), static_cast<size_t>(kSteps));
  const auto resumed = gpt_train(shape, dir,
                                 "--steps " + std::to_string(kSteps) + flag("load_dir", dir / "ckpt") +
                                     " --load_tag global_step" + std::to_string(kSaveAt) +
                                     flag("save_16bit", dir / "resumed.st"));
  ASSERT_TRUE(resumed.ok()) << resumed.errors();
  ASSERT_EQ(resumed.metrics.size(), static_cast<size_t>(kSteps - kSaveAt));
  for (size_t i = 0; i < resumed.metrics.size(); ++i) {
    const auto& want = full.metrics[kSaveAt + i];
    const auto& got = resumed.metrics[i];
    EXPECT_EQ(got["step"], want["step"]);
    // Bitwise: == on the doubles, not a tolerance.
    for (const char* key : {"loss", "grad_norm", "lr", "loss_scale"}) {
      EXPECT_EQ(got[key].get<double>(), want[key].get<double>()) << shape.name() << " step " << got["step"] << " " << key;
    }
  }
  // The final weights are the same bytes.
  const auto a = read_text(dir / "full.st"), b = read_text(dir / "resumed.st");
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << shape.name() << ": the resumed run's final weights differ from the uninterrupted run's";
}

INSTANTIATE_TEST_SUITE_P(EveryStage, ExactResume,
                         ::testing::Values(Shape{1, 0}, Shape{1, 1}, Shape{1, 2}, Shape{1, 3}, Shape{2, 0},
                                           Shape{2, 1}, Shape{2, 2}, Shape{2, 3}, Shape{2, 2, false, 2},
                                           Shape{2, 1, true}, Shape{2, 3, true},
                                           // Offloaded optimizer state is saved and restored like any other.
                                           Shape{2, 1, false, 1, "cpu"}, Shape{2, 3, false, 2, "cpu"},
                                           Shape{1, 2, true, 1, "cpu"}, Shape{2, 3, false, 1, "nvme"},
                                           Shape{1, 1, true, 1, "nvme"}, Shape{2, 3, true, 1, "nvme", true}),
                         [](const auto& info) { return info.param.name(); });

// ---- Resharding: written by N ranks at stage s, loaded by M ranks at stage t. ----

struct Reshard {
  Shape from, to;
  std::string name() const { return from.name() + "_to_" + to.name(); }
};

// The uninterrupted run every resharded continuation is compared with: stage 0 on one process.
const std::vector<nlohmann::json>& reference(bool bf16) {
  static std::map<bool, std::vector<nlohmann::json>> cache;
  auto it = cache.find(bf16);
  if (it == cache.end()) {
    const auto dir = temp_dir(std::string("reshard_reference") + (bf16 ? "_bf16" : ""));
    const auto run = gpt_train(Shape{1, 0, bf16}, dir, "--steps " + std::to_string(kSteps));
    EXPECT_TRUE(run.ok()) << run.errors();
    it = cache.emplace(bf16, run.metrics).first;
  }
  return it->second;
}

// A checkpoint at step 3 written by `shape`, made once per shape.
fs::path checkpoint_of(const Shape& shape) {
  static std::map<std::string, fs::path> cache;
  auto it = cache.find(shape.name());
  if (it == cache.end()) {
    const auto dir = temp_dir("reshard_source_" + shape.name());
    const auto run = gpt_train(shape, dir, "--steps " + std::to_string(kSaveAt) + flag("save_dir", dir / "ckpt"));
    EXPECT_TRUE(run.ok()) << run.errors();
    it = cache.emplace(shape.name(), dir / "ckpt").first;
  }
  return it->second;
}

void PrintTo(const Reshard& reshard, std::ostream* os) { *os << reshard.name(); }

class Resharding : public ::testing::TestWithParam<Reshard> {};

TEST_P(Resharding, ContinuesAsTheUninterruptedRun) {
  const Reshard r = GetParam();
  const auto& want = reference(r.to.bf16);
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));
  const auto source = checkpoint_of(r.from);
  const auto dir = temp_dir("reshard_" + r.name());
  const auto run = gpt_train(r.to, dir, "--steps " + std::to_string(kSteps) + flag("load_dir", source));
  ASSERT_TRUE(run.ok()) << run.errors();
  ASSERT_EQ(run.metrics.size(), static_cast<size_t>(kSteps - kSaveAt));
  const double tolerance = r.to.bf16 ? 1e-2 : 1e-5;
  for (size_t i = 0; i < run.metrics.size(); ++i) {
    const double expected = want[kSaveAt + i]["loss"].get<double>(), got = run.metrics[i]["loss"].get<double>();
    EXPECT_LE(std::abs(got - expected) / std::abs(expected), tolerance)
        << r.name() << " step " << run.metrics[i]["step"] << ": loss " << got << ", uninterrupted " << expected;
    // Optimizer state came along: Adam's second step after a fresh start would move the loss far more.
    EXPECT_EQ(run.metrics[i]["lr"].get<double>(), want[kSaveAt + i]["lr"].get<double>());
  }
}

// Every world size and stage written, and every one loaded: the long label's (LongMatrix: tests/checkpoint).
std::vector<Reshard> reshard_matrix() {
  std::vector<Reshard> cases;
  for (int n : {1, 2, 4})
    for (int m : {1, 2, 4})
      for (int s = 0; s < 4; ++s)
        for (int t = 0; t < 4; ++t)
          if (n != m || s != t) cases.push_back({Shape{n, s}, Shape{m, t}});
  return cases;
}

// The default set's sample of it, with bf16, offloaded optimizers and accumulation.
std::vector<Reshard> reshard_sample() {
  return {{Shape{1, 1}, Shape{2, 3}}, {Shape{2, 3}, Shape{1, 0}}, {Shape{4, 2}, Shape{2, 1}},
          {Shape{2, 0}, Shape{4, 3}}, {Shape{4, 3}, Shape{2, 2}}, {Shape{2, 2, true}, Shape{1, 3, true}},
          // Into and out of an offloaded optimizer: the checkpoint does not record where the state lived.
          {Shape{2, 2, false, 1, "cpu"}, Shape{1, 3}}, {Shape{2, 0}, Shape{2, 3, false, 1, "cpu"}},
          {Shape{2, 2, false, 1, "nvme"}, Shape{1, 1}}, {Shape{1, 3}, Shape{2, 2, false, 1, "nvme"}},
          // The same global batch by accumulation: 3 saved micro-steps of 1 are 6 of this run's 2, so its next
          // boundary ends a whole batch.
          {Shape{2, 2}, Shape{1, 1, false, 2}}};
}

INSTANTIATE_TEST_SUITE_P(LongMatrix, Resharding, ::testing::ValuesIn(reshard_matrix()),
                         [](const auto& info) { return info.param.name(); });
INSTANTIATE_TEST_SUITE_P(Matrix, Resharding, ::testing::ValuesIn(reshard_sample()),
                         [](const auto& info) { return info.param.name(); });

// ---- A save killed (SIGKILL) at each point of the protocol leaves the previous checkpoint usable. ----

std::string file_bytes_of(const fs::path& dir) {
  std::string all;
  for (const auto& entry : fs::directory_iterator(dir)) all += entry.path().filename().string() + read_text(entry.path());
  return all;
}

class KilledSave : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledSave, LeavesThePreviousCheckpointAndLatestIntact) {
  const std::string point = GetParam();
  const Shape shape{2, 2};
  const auto dir = temp_dir("killed_" + point);
  const auto ckpt = dir / "ckpt";
  const auto first = gpt_train(shape, dir, "--steps 2" + flag("save_dir", ckpt));
  ASSERT_TRUE(first.ok()) << first.errors();
  const auto before = file_bytes_of(ckpt / "global_step2");

  const auto killed = gpt_train(shape, dir, "--steps 4" + flag("load_dir", ckpt) + flag("save_dir", ckpt),
                                "DSCPP_KILL_AT=checkpoint." + point);
  EXPECT_EQ(killed.ranks[0].code, 137) << "rank 0 was not killed at " << point << ":\n" << killed.errors();
  EXPECT_EQ(killed.metrics.size(), 2u);  // it trained steps 3-4 and died saving step 4

  EXPECT_EQ(read_text(ckpt / "latest"), "global_step2\n");
  EXPECT_EQ(file_bytes_of(ckpt / "global_step2"), before);
  // Killed before the rename, the new tag does not exist; after it, it is complete (`latest` is the last write).
  if (point == "published") {
    EXPECT_NO_THROW(Manifest::read((ckpt / "global_step4").string()));
  } else {
    EXPECT_FALSE(fs::exists(ckpt / "global_step4"));
    EXPECT_EQ(list_tags(ckpt.string()), std::vector<std::string>{"global_step2"});
  }

  // Resuming from `latest` works and continues exactly; its save clears the dead one's staging directory.
  const auto again = gpt_train(shape, dir, "--steps 4" + flag("load_dir", ckpt) + flag("save_dir", ckpt));
  ASSERT_TRUE(again.ok()) << again.errors();
  ASSERT_EQ(again.metrics.size(), 2u);
  EXPECT_EQ(again.metrics[1]["loss"].get<double>(), killed.metrics[1]["loss"].get<double>());
  EXPECT_EQ(read_text(ckpt / "latest"), "global_step4\n");
  EXPECT_FALSE(fs::exists(staging_dir(ckpt.string(), "global_step4")));
}

INSTANTIATE_TEST_SUITE_P(EveryPoint, KilledSave,
                         ::testing::Values("shard_half_written", "shard_written", "manifest_written", "published"),
                         [](const auto& info) { return info.param; });

// ---- Damaged checkpoints: a clear error naming the file, on every rank, and nothing saved is touched. ----

struct Damage {
  std::string name;
  std::function<void(const fs::path& tag_dir)> apply;
  std::string load_args;  // beyond --load_dir
  std::string expected;   // in rank 0's or rank 1's error
};

TEST(DamagedCheckpoint, EachDamageIsAClearErrorAndNothingIsTouched) {
  const Shape shape{2, 1};
  const auto dir = temp_dir("damaged");
  const auto good = gpt_train(shape, dir, "--steps 2" + flag("save_dir", dir / "good"));
  ASSERT_TRUE(good.ok()) << good.errors();
  const std::vector<Damage> damages = {
      {"missing_shard", [](const fs::path& t) { fs::remove(t / "rank_00001.safetensors"); }, "",
       "rank_00001.safetensors: shard file of rank 1 is missing"},
      {"flipped_byte",
       [](const fs::path& t) {
         const auto path = (t / "rank_00000.safetensors").string();
         const auto at = SafetensorsReader(path).tensor("master/wte.weight").offset + 100;
         std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
         f.seekg(at);
         const char c = static_cast<char>(f.get());
         f.seekp(at);
         f.put(static_cast<char>(c ^ 0x10));
       },
       "", "checksum mismatch in tensor 'master/wte.weight'"},
      {"truncated", [](const fs::path& t) { fs::resize_file(t / "rank_00001.safetensors", 4096); }, "",
       "rank_00001.safetensors: truncated"},
      // A shard that is a link reads a file from elsewhere (here an intact copy): refused, not followed.
      {"linked_shard",
       [](const fs::path& t) {
         fs::copy_file(t / "rank_00001.safetensors", t.parent_path().parent_path() / "shard_elsewhere");
         fs::remove(t / "rank_00001.safetensors");
         fs::create_symlink(t.parent_path().parent_path() / "shard_elsewhere", t / "rank_00001.safetensors");
       },
       "", "rank_00001.safetensors: shard file of rank 1 is a symbolic link"},
      {"bad_manifest", [](const fs::path& t) { std::ofstream(t / "manifest.json") << "{\"format\": "; }, "",
       "manifest.json: not valid JSON"},
      {"other_model", [](const fs::path&) {}, " --n_layer 3", "written for a different model"},
      {"missing_tag", [](const fs::path&) {}, " --load_tag global_step7", "tag 'global_step7' does not exist"},
      // A directory with tags but no `latest` is damaged, not empty: it must not restart the job from step 0.
      {"missing_latest", [](const fs::path& t) { fs::remove(t.parent_path() / "latest"); }, "",
       "latest: missing, so there is no latest checkpoint to load"},
  };
  for (const auto& damage : damages) {
    const auto root = dir / damage.name;
    fs::copy(dir / "good", root, fs::copy_options::recursive);
    damage.apply(root / "global_step2");
    const auto saved = file_bytes_of(root / "global_step2");
    const auto run = gpt_train(shape, dir, "--steps 4" + flag("load_dir", root) + damage.load_args);
    for (int r = 0; r < shape.world; ++r) {
      EXPECT_EQ(run.ranks[r].code, 1) << damage.name << " rank " << r << ":\n" << run.errors();
    }
    EXPECT_TRUE(run.metrics.empty()) << damage.name << ": trained after a failed load";
    const auto all_errors = run.ranks[0].err + run.ranks[1].err;
    EXPECT_NE(all_errors.find(damage.expected), std::string::npos) << damage.name << ":\n" << run.errors();
    EXPECT_NE(all_errors.find((root).string()), std::string::npos) << damage.name << ": the path is not named";
    EXPECT_EQ(file_bytes_of(root / "global_step2"), saved) << damage.name << ": the failed load changed the files";
  }
}

// One command line for the first start and every restart: `--save_dir D --load_dir D` starts from step 0 while D
// holds no checkpoint (and says so), then resumes from it, continuing bitwise as the run that never stopped.
TEST(RestartCommandLine, StartsFreshOnAnEmptyDirectoryThenResumes) {
  const Shape shape{2, 1};
  const auto dir = temp_dir("restart_line");
  const auto full = gpt_train(shape, dir, "--steps 4");
  ASSERT_TRUE(full.ok()) << full.errors();
  const std::string same = flag("save_dir", dir / "ckpt") + flag("load_dir", dir / "ckpt");
  const auto first = gpt_train(shape, dir, "--steps 2" + same);
  ASSERT_TRUE(first.ok()) << first.errors();
  EXPECT_NE(first.ranks[0].err.find("holds no checkpoint yet: starting from step 0"), std::string::npos)
      << first.errors();
  const auto again = gpt_train(shape, dir, "--steps 4" + same);
  ASSERT_TRUE(again.ok()) << again.errors();
  EXPECT_NE(again.ranks[0].err.find("loaded checkpoint"), std::string::npos) << again.errors();
  ASSERT_EQ(again.metrics.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(again.metrics[i]["step"], full.metrics[2 + i]["step"]);
    EXPECT_EQ(again.metrics[i]["loss"].get<double>(), full.metrics[2 + i]["loss"].get<double>());
  }
}

// ---- consolidate: exact weights from any layout, streaming (peak RSS measured), HF GPT-2 back into gpt-train. ----

CommandResult dscpp(const std::string& args) { return run_command(std::string(DSCPP_BINARY_DIR) + "/dscpp " + args); }

int64_t printed_peak_rss(const std::string& out) {
  const auto at = out.find("peak RSS ");
  return at == std::string::npos ? -1 : std::stoll(out.substr(at + 9));
}

TEST(Consolidate, WritesTheGatheredWeightsExactly) {
  const Shape shape{2, 3};
  const auto dir = temp_dir("consolidate_exact");
  const auto run = gpt_train(shape, dir, "--steps 2" + flag("save_dir", dir / "ckpt") + flag("save_16bit", dir / "w.st"));
  ASSERT_TRUE(run.ok()) << run.errors();
  const auto out = dscpp("consolidate " + (dir / "ckpt").string() + " " + (dir / "fp32").string());
  ASSERT_EQ(out.code, 0) << out.err;
  const auto want = read_safetensors((dir / "w.st").string());
  const auto got = read_safetensors((dir / "fp32" / "model.safetensors").string());
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, value] : want) EXPECT_TRUE(torch::equal(got.at(name), value)) << name;

  // Sharded by size, with HF's index naming every tensor's file.
  const auto sharded = dscpp("consolidate " + (dir / "ckpt").string() + " " + (dir / "sharded").string() +
                             " --max_shard_size 500KB --dtype bf16");
  ASSERT_EQ(sharded.code, 0) << sharded.err;
  const auto index = nlohmann::json::parse(read_text(dir / "sharded" / "model.safetensors.index.json"));
  EXPECT_EQ(index["weight_map"].size(), want.size());
  int64_t total = 0;
  for (const auto& [name, file] : index["weight_map"].items()) {
    const auto part = read_safetensors((dir / "sharded" / file.get<std::string>()).string());
    EXPECT_TRUE(torch::equal(part.at(name), want.at(name).to(torch::kBFloat16))) << name;
    total += static_cast<int64_t>(part.at(name).nbytes());
    EXPECT_LE(fs::file_size(dir / "sharded" / file.get<std::string>()), 500'000u + 16'384u);
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);

  // HF GPT-2 layout, then back in through gpt-train --init_from (lr 0: the weights it saves are the ones it read).
  const auto hf = dscpp("consolidate " + (dir / "ckpt").string() + " " + (dir / "hf").string() + " --format hf-gpt2");
  ASSERT_EQ(hf.code, 0) << hf.err;
  EXPECT_TRUE(fs::exists(dir / "hf" / "config.json"));
  const auto back = run_command(gpt_train_command() + " --no_progress --model tiny --seq_len 32 "
                                "--steps 1 --lr 0 --weight_decay 0 --init_from " + (dir / "hf").string() +
                                flag("save_16bit", dir / "back.st"));
  ASSERT_EQ(back.code, 0) << back.err;
  const auto reloaded = read_safetensors((dir / "back.st").string());
  for (const auto& [name, value] : want) EXPECT_TRUE(torch::equal(reloaded.at(name), value)) << name;
}

TEST(Consolidate, InitFromTakesTheShapeFromConfigJson) {
  const auto dir = temp_dir("init_from_config");
  // A 2-layer model (the tiny preset has more) on bytes: its config.json says n_layer 2 and 256 tokens.
  const auto trained = run_command(gpt_train_command() + " --no_progress --model tiny --n_layer 2 --seq_len 32 "
                                   "--steps 2" + flag("save_dir", dir / "ckpt") + flag("save_16bit", dir / "w.st"));
  ASSERT_EQ(trained.code, 0) << trained.err;
  ASSERT_EQ(dscpp("consolidate " + (dir / "ckpt").string() + " " + (dir / "hf").string() + " --format hf-gpt2").code,
            0);
  // Raw uint16 tokens below 100: a 128-token vocabulary in the checkpoint's 256-row table.
  {
    std::ofstream tokens(dir / "tokens.bin", std::ios::binary);
    for (uint16_t i = 0; i < 4096; ++i) {
      const uint16_t token = static_cast<uint16_t>((i * 37) % 100);
      tokens.write(reinterpret_cast<const char*>(&token), sizeof(token));
    }
  }
  const std::string from = " --no_progress --model tiny --seq_len 32 --steps 1 --lr 0 --weight_decay 0 --init_from " +
                           (dir / "hf").string() + flag("data", dir / "tokens.bin");
  const auto back = run_command(gpt_train_command() + from + flag("save_16bit", dir / "back.st"));
  ASSERT_EQ(back.code, 0) << back.err;
  EXPECT_NE(back.err.find("2 layers"), std::string::npos) << back.err;
  const auto want = read_safetensors((dir / "w.st").string());
  const auto reloaded = read_safetensors((dir / "back.st").string());
  ASSERT_EQ(reloaded.size(), want.size());
  for (const auto& [name, value] : want) EXPECT_TRUE(torch::equal(reloaded.at(name), value)) << name;
  // A shape flag that contradicts config.json is an error naming both.
  const auto contradicting = run_command(gpt_train_command() + from + " --n_layer 3");
  EXPECT_NE(contradicting.code, 0);
  EXPECT_NE(contradicting.err.find("--n_layer 3 contradicts"), std::string::npos) << contradicting.err;
}

TEST(Consolidate, PeakMemoryStaysNearTheLargestTensorNotTheModel) {
  DSCPP_SKIP_WHEN_SANITIZED("peak RSS includes its shadow memory and quarantine");
  // 12 blocks of width 512: 38M parameters, 153 MB of fp32 weights; the largest tensor is 4 MB.
  const Shape shape{1, 0};
  const auto dir = temp_dir("consolidate_rss");
  const std::string big = "--n_layer 12 --n_embd 512 --n_head 8 --micro_batch 1 --steps 1";
  const auto run = run_command(gpt_train_command() + " --no_progress --model tiny --seq_len 16 " +
                               big + " --deepspeed_config " + write_config(dir, shape, "SGD") +
                               flag("save_dir", dir / "big"));
  ASSERT_EQ(run.code, 0) << run.err;
  const auto small = gpt_train(shape, dir, "--steps 1" + flag("save_dir", dir / "small"));
  ASSERT_TRUE(small.ok()) << small.errors();
  const auto big_out = dscpp("consolidate " + (dir / "big").string() + " " + (dir / "big_out").string());
  const auto small_out = dscpp("consolidate " + (dir / "small").string() + " " + (dir / "small_out").string());
  ASSERT_EQ(big_out.code, 0) << big_out.err;
  ASSERT_EQ(small_out.code, 0) << small_out.err;
  const int64_t model_bytes = static_cast<int64_t>(fs::file_size(dir / "big_out" / "model.safetensors"));
  const int64_t largest = 2048 * 512 * 4;
  const int64_t growth = printed_peak_rss(big_out.out) - printed_peak_rss(small_out.out);
  std::cout << "consolidate peak RSS: " << printed_peak_rss(big_out.out) << " B for a " << model_bytes
            << " B model, " << printed_peak_rss(small_out.out) << " B for tiny; growth " << growth
            << " B, largest tensor " << largest << " B\n";
  EXPECT_GT(model_bytes, 150'000'000);
  EXPECT_LT(growth, 4 * largest) << big_out.out;
}


}  // namespace
}  // namespace dscpp::testing
