// "auto" filling (HF Trainer mapping), unfilled "auto" errors, and unknown-key warnings with suggestions.
#include <gtest/gtest.h>

#include "config_test_util.h"
#include "dscpp/config/known_keys.h"

namespace dscpp {
namespace {

using nlohmann::json;
using testing::error_of;
using testing::parse;
using testing::user_args;

std::vector<std::string> warnings_of(const json& config) {
  std::vector<std::string> warnings;
  parse(config, {}, &warnings);
  return warnings;
}

TEST(UnknownKeys, TypoAtTopLevelSuggestsClosest) {
  auto w = warnings_of({{"train_batch_size", 8}, {"gradient_acumulation_steps", 2}});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_CONTAINS(w[0], "'gradient_acumulation_steps'");
  EXPECT_CONTAINS(w[0], "did you mean 'gradient_accumulation_steps'?");
}

// Inside a section an unknown key is an error (DeepSpeed's section models forbid extras; optimizer and scheduler
// params become constructor arguments, which Python rejects), with the closest key.
TEST(UnknownKeys, TypoInsideSectionsIsAnError) {
  auto w = error_of({{"train_batch_size", 8}, {"zero_optimization", {{"stage", 2}, {"overlap_com", true}}}});
  EXPECT_CONTAINS(w, "unknown config key 'zero_optimization.overlap_com'");
  EXPECT_CONTAINS(w, "did you mean 'zero_optimization.overlap_comm'?");
  auto p = error_of({{"train_batch_size", 8},
                     {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}, {"weight_decy", 0.1}}}}}});
  EXPECT_CONTAINS(p, "did you mean 'optimizer.params.weight_decay'?");
  auto s = error_of({{"train_batch_size", 8},
                     {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_step", 10}}}}}});
  EXPECT_CONTAINS(s, "did you mean 'scheduler.params.warmup_num_steps'?");
  // A key of another optimizer type is unknown for this one.
  auto m = error_of({{"train_batch_size", 8}, {"optimizer", {{"type", "AdamW"}, {"params", {{"momentum", 0.9}}}}}});
  EXPECT_CONTAINS(m, "'optimizer.params.momentum'");
}

TEST(UnknownKeys, WrongLevelAndShortenedNames) {
  auto w = warnings_of({{"train_batch_size", 8}, {"overlap_comm", true}});
  ASSERT_EQ(w.size(), 1u);
  EXPECT_CONTAINS(w[0], "did you mean 'zero_optimization.overlap_comm'?");
  auto s = error_of({{"train_batch_size", 8}, {"zero_optimization", {{"reuse_distance", 100}}}});
  EXPECT_CONTAINS(s, "did you mean 'zero_optimization.stage3_max_reuse_distance'?");
  auto far = warnings_of({{"train_batch_size", 8}, {"completely_unrelated", 1}});
  ASSERT_EQ(far.size(), 1u);
  EXPECT_EQ(far[0].find("did you mean"), std::string::npos) << far[0];
}

TEST(UnknownKeys, DeepSpeedKeysWeDoNotUseAreQuiet) {
  auto w = warnings_of({{"train_batch_size", 8},
                        {"zero_allow_untested_optimizer", true},
                        {"fp16", {{"fp16_master_weights_and_grads", false}}},
                        {"zero_optimization", {{"stage", 3}, {"stage3_gather_fp16_weights_on_model_save", true}}}});
  EXPECT_TRUE(w.empty()) << w.front();
}

TEST(Levenshtein, Distances) {
  EXPECT_EQ(levenshtein("", "abc"), 3u);
  EXPECT_EQ(levenshtein("kitten", "sitting"), 3u);
  EXPECT_EQ(levenshtein("overlap_com", "overlap_comm"), 1u);
}

TEST(AutoValues, FromHfArgsMapsLikeHfTrainer) {
  AutoValues::HfArgs args = user_args();
  args.world_size = 2;
  const auto v = AutoValues::from_hf_args(args).values;
  EXPECT_EQ(v.at("train_micro_batch_size_per_gpu"), 4);
  EXPECT_EQ(v.at("gradient_accumulation_steps"), 2);
  EXPECT_EQ(v.at("train_batch_size"), 16);
  EXPECT_EQ(v.at("gradient_clipping"), 1.0);
  EXPECT_EQ(v.at("optimizer.params.lr"), 3e-4);
  EXPECT_EQ(v.at("optimizer.params.weight_decay"), 0.01);
  EXPECT_EQ(v.at("optimizer.params.betas"), json({0.9, 0.999}));
  EXPECT_EQ(v.at("optimizer.params.eps"), 1e-8);
  EXPECT_EQ(v.at("scheduler.params.warmup_min_lr"), 0.0);
  EXPECT_EQ(v.at("scheduler.params.warmup_max_lr"), 3e-4);
  EXPECT_EQ(v.at("scheduler.params.warmup_num_steps"), 10);
  EXPECT_EQ(v.at("scheduler.params.total_num_steps"), 100);
  EXPECT_EQ(v.at("fp16.enabled"), true);
  EXPECT_EQ(v.at("bf16.enabled"), false);
  EXPECT_EQ(v.at("zero_optimization.reduce_bucket_size"), 589824);
  EXPECT_EQ(v.at("zero_optimization.stage3_prefetch_bucket_size"), 530841);
  EXPECT_EQ(v.at("zero_optimization.stage3_param_persistence_threshold"), 7680);
  // Unset args fill nothing (besides HF's always-filled betas/eps/warmup_min_lr).
  const auto empty = AutoValues::from_hf_args({}).values;
  EXPECT_EQ(empty.count("optimizer.params.lr"), 0u);
  EXPECT_EQ(empty.count("fp16.enabled"), 0u);
  EXPECT_EQ(empty.count("train_batch_size"), 0u);
}

TEST(AutoValues, FillsAutoAndBatch) {
  ConfigOptions options;
  options.world_size = 2;
  options.auto_values = AutoValues::from_hf_args(user_args());
  Config c = parse({{"train_batch_size", "auto"},
                    {"train_micro_batch_size_per_gpu", "auto"},
                    {"gradient_clipping", "auto"},
                    {"fp16", {{"enabled", "auto"}}},
                    {"bf16", {{"enabled", "auto"}}},
                    {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}, {"betas", "auto"}}}}},
                    {"zero_optimization", {{"stage", 3}, {"stage3_prefetch_bucket_size", "auto"}}}},
                   options);
  EXPECT_EQ(c.batch.train_batch_size, 16);
  EXPECT_EQ(c.batch.micro_batch, 4);
  EXPECT_EQ(c.batch.grad_accum, 2);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_TRUE(c.fp16.enabled);
  EXPECT_FALSE(c.bf16);
  EXPECT_EQ(c.optimizer->lr(), 3e-4);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 530841);
  EXPECT_EQ(c.resolved.dump().find("\"auto\""), std::string::npos) << c.resolved.dump();
}

TEST(AutoValues, ExplicitBatchNumbersWin) {
  ConfigOptions options;
  options.world_size = 2;
  options.auto_values = AutoValues::from_hf_args(user_args());
  Config c = parse({{"train_micro_batch_size_per_gpu", 1}, {"gradient_accumulation_steps", 4}}, options);
  EXPECT_EQ(c.batch.train_batch_size, 8);
  EXPECT_EQ(c.batch.micro_batch, 1);
  EXPECT_EQ(c.batch.grad_accum, 4);
}

TEST(AutoValues, UnfilledBatchAutoIsSolvedByTheTriangle) {
  ConfigOptions options;
  options.world_size = 4;
  Config c = parse({{"train_batch_size", "auto"}, {"train_micro_batch_size_per_gpu", 2}}, options);
  EXPECT_EQ(c.batch.train_batch_size, 8);
  EXPECT_EQ(c.batch.grad_accum, 1);
}

// The program's default micro-batch (gpt-train's 8) fills only a batch the config leaves free: a micro-batch its
// numbers determine is solved by the triangle, never contradicted by the default.
TEST(AutoValues, DefaultMicroBatchFillsOnlyAFreeBatch) {
  ConfigOptions options;
  AutoValues::HfArgs args;
  args.default_micro_batch = 8;
  options.auto_values = AutoValues::from_hf_args(args);
  const Config solved = parse({{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", "auto"},
                               {"gradient_accumulation_steps", 8}}, options);
  EXPECT_EQ(solved.batch.micro_batch, 4);
  options.world_size = 2;
  EXPECT_EQ(parse({{"train_batch_size", 16}}, options).batch.micro_batch, 8);  // 16 / 2 ranks, the triangle's
  EXPECT_EQ(parse({{"train_batch_size", 12}}, options).batch.micro_batch, 6);
  const Config free_batch = parse({{"gradient_accumulation_steps", 2}}, options);
  EXPECT_EQ(free_batch.batch.micro_batch, 8);
  EXPECT_EQ(free_batch.batch.train_batch_size, 32);
  EXPECT_EQ(parse(json::object(), options).batch.micro_batch, 8);
  // A flag is the user's word, as in the HF Trainer: it fills and a contradiction is an error.
  args.micro_batch = 8;
  options.world_size = 1;
  options.auto_values = AutoValues::from_hf_args(args);
  EXPECT_CONTAINS(error_of({{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", "auto"},
                            {"gradient_accumulation_steps", 8}},
                           options),
                  "train_micro_batch_size_per_gpu=8");
}

TEST(AutoValues, OverridesBeatAuto) {
  ConfigOptions options;
  options.overrides["optimizer.params.lr"] = 5e-5;
  Config c = parse({{"train_batch_size", 1}, {"optimizer", {{"type", "Adam"}, {"params", {{"lr", "auto"}}}}}},
                   options);
  EXPECT_EQ(c.optimizer->lr(), 5e-5);
}

TEST(AutoValues, UnfilledAutoNamesTheKeyAndTheFlag) {
  std::string e = error_of({{"train_batch_size", 1}, {"optimizer", {{"type", "Adam"}, {"params", {{"lr", "auto"}}}}}});
  EXPECT_CONTAINS(e, "optimizer.params.lr = \"auto\"");
  EXPECT_CONTAINS(e, "--set optimizer.params.lr=VALUE");
  EXPECT_CONTAINS(e, "--lr");
  EXPECT_CONTAINS(error_of({{"train_batch_size", 1}, {"gradient_clipping", "auto"}}), "gradient_clipping = \"auto\"");
  EXPECT_CONTAINS(error_of({{"train_batch_size", 1}, {"zero_optimization", {{"reduce_bucket_size", "auto"}}}}),
                  "--hidden_size");
  // Even under a top-level key we do not know (a warning), "auto" never survives into `resolved`.
  EXPECT_CONTAINS(error_of({{"train_batch_size", 1}, {"mystery", {{"inner", "auto"}}}}), "mystery.inner = \"auto\"");
  // A batch with nothing at all is the triangle's error.
  EXPECT_CONTAINS(error_of({{"train_batch_size", "auto"}}), "set train_batch_size or train_micro_batch_size_per_gpu");
}

}  // namespace
}  // namespace dscpp
