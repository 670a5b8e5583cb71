// Engine, stage 0 on one process, fp32: the training step against plain LibTorch references.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dscpp/dscpp.h"
#include "test_models.h"
#include "../common/subprocess.h"

namespace dscpp::testing {
namespace {

// Parameters of `model` as one flat fp32 vector.
torch::Tensor flat_params(torch::nn::Module& model) {
  std::vector<torch::Tensor> parts;
  for (auto& p : model.parameters()) parts.push_back(p.detach().to(torch::kFloat32).reshape(-1));
  return torch::cat(parts);
}

double max_rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
}

// Trains `steps` optimizer steps with the engine; micro-batches are consecutive slices of the global batch.
torch::Tensor train_engine(const std::string& json, int64_t steps, int64_t global_batch, std::vector<double>* losses = nullptr) {
  torch::manual_seed(0);
  auto model = Mlp();
  auto config = config_from(json);
  auto engine = initialize(model.ptr(), config);
  auto [x, y] = regression_data(steps * global_batch);
  const int64_t micro = config.batch.micro_batch;
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t m = 0; m < config.batch.grad_accum; ++m) {
      const int64_t row = s * global_batch + m * micro;
      auto loss = model->loss(x.narrow(0, row, micro), y.narrow(0, row, micro));
      engine->backward(loss);
      engine->step();
    }
    if (losses) losses->push_back(engine->last_step().loss);
  }
  return flat_params(*model);
}

TEST(Engine, MatchesPlainLibTorchAdamW) {
  const int64_t steps = 10, batch = 16;
  // Without clipping (DeepSpeed's default clips at 1.0), as the plain loop below.
  auto engine_params = train_engine(R"({"train_batch_size": 16, "gradient_clipping": 0,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1, "betas": [0.9, 0.99], "eps": 1e-8}}})",
                                    steps, batch);
  torch::manual_seed(0);
  auto model = Mlp();
  torch::optim::AdamW opt(model->parameters(),
                          torch::optim::AdamWOptions(0.01).weight_decay(0.1).betas({0.9, 0.99}).eps(1e-8));
  auto [x, y] = regression_data(steps * batch);
  for (int64_t s = 0; s < steps; ++s) {
    opt.zero_grad();
    model->loss(x.narrow(0, s * batch, batch), y.narrow(0, s * batch, batch)).backward();
    opt.step();
  }
  EXPECT_LT(max_rel_diff(engine_params, flat_params(*model)), 1e-5);
}

// InitOptions::param_groups (DeepSpeed's parameter groups): the biases at a weight decay and lr of their own, the
// lr moved halfway (a client schedule), give LibTorch AdamW's result over the same two groups; a name that is not a
// trainable parameter, or one in two groups, is an error naming it.
TEST(Engine, ParameterGroupsMatchLibTorchParamGroups) {
  const int64_t steps = 10, batch = 16;
  const std::string json = R"({"train_batch_size": 16, "gradient_clipping": 0,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}})";
  auto bias_lr = [](int64_t step) { return step < 5 ? 0.003 : 0.02; };
  torch::manual_seed(0);
  auto model = Mlp();
  InitOptions init;
  init.param_groups = {{{"fc1.bias", "fc2.bias"}, 5.0, bias_lr(0)}};
  auto engine = initialize(model.ptr(), config_from(json), init);
  auto [x, y] = regression_data(steps * batch);
  for (int64_t s = 0; s < steps; ++s) {
    engine->set_group_lr(0, bias_lr(s));
    EXPECT_EQ(engine->group_lrs(), std::vector<double>{bias_lr(s)});
    engine->backward(model->loss(x.narrow(0, s * batch, batch), y.narrow(0, s * batch, batch)));
    engine->step();
  }
  torch::manual_seed(0);
  auto reference = Mlp();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{reference->fc1->weight, reference->fc2->weight},
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.01).weight_decay(0.1)));
  groups.emplace_back(std::vector<torch::Tensor>{reference->fc1->bias, reference->fc2->bias},
                      std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(0.01).weight_decay(5.0)));
  torch::optim::AdamW opt(std::move(groups), torch::optim::AdamWOptions(0.01));
  for (int64_t s = 0; s < steps; ++s) {
    static_cast<torch::optim::AdamWOptions&>(opt.param_groups()[1].options()).lr(bias_lr(s));
    opt.zero_grad();
    reference->loss(x.narrow(0, s * batch, batch), y.narrow(0, s * batch, batch)).backward();
    opt.step();
  }
  EXPECT_LT(max_rel_diff(flat_params(*model), flat_params(*reference)), 1e-5);
  // Without the groups the run differs by far more than that.
  EXPECT_GT(max_rel_diff(train_engine(json, steps, batch), flat_params(*reference)), 1e-3);

  auto error_of = [&](const std::vector<OptimizerParamGroup>& param_groups) {
    InitOptions bad;
    bad.param_groups = param_groups;
    try {
      initialize(Mlp().ptr(), config_from(json), bad);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({{{"fc3.bias"}, 0.0, std::nullopt}}).find("InitOptions::param_groups[0] names 'fc3.bias'"),
            std::string::npos);
  EXPECT_NE(error_of({{{"fc1.bias"}, 0.0, std::nullopt}, {{"fc1.bias"}, std::nullopt, 0.1}})
                .find("param_groups[1] names 'fc1.bias', which group 0 holds already"),
            std::string::npos);
  EXPECT_NE(error_of({{{"fc1.bias"}, std::nullopt, -1.0}}).find("param_groups[0].lr must be >= 0"),
            std::string::npos);
  EXPECT_THROW(engine->set_group_lr(1, 0.1), std::invalid_argument);
}

// A config scheduler sets every group's lr, as DeepSpeed's schedulers do: a group's own lr is not used (its weight
// decay is), and set_group_lr is refused rather than fighting the schedule.
TEST(Engine, ConfigSchedulerSetsEveryGroupsLr) {
  const int64_t steps = 6, batch = 16;
  const std::string json = R"({"train_batch_size": 16,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
      "scheduler": {"type": "WarmupLR",
                    "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 4}}})";
  auto run = [&](std::optional<double> group_lr) {
    torch::manual_seed(0);
    auto model = Mlp();
    InitOptions init;
    init.param_groups = {{{"fc1.bias", "fc2.bias"}, 5.0, group_lr}};
    auto engine = initialize(model.ptr(), config_from(json), init);
    EXPECT_EQ(engine->group_lrs(), std::vector<double>{engine->lr()});
    EXPECT_THROW(engine->set_group_lr(0, 0.5), std::logic_error);
    auto [x, y] = regression_data(steps * batch);
    for (int64_t s = 0; s < steps; ++s) {
      engine->backward(model->loss(x.narrow(0, s * batch, batch), y.narrow(0, s * batch, batch)));
      engine->step();
    }
    return flat_params(*model);
  };
  EXPECT_TRUE(torch::equal(run(0.5), run(std::nullopt)));
}

TEST(Engine, AccumulationEqualsLargeBatch) {
  const std::string opt = R"("optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}})";
  std::vector<double> loss_gas4, loss_gas1;
  auto gas4 = train_engine(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4, )" + opt + "}",
                           8, 16, &loss_gas4);
  auto gas1 = train_engine(R"({"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, )" + opt + "}",
                           8, 16, &loss_gas1);
  EXPECT_LT(max_rel_diff(gas4, gas1), 1e-5);
  ASSERT_EQ(loss_gas4.size(), loss_gas1.size());
  for (size_t i = 0; i < loss_gas1.size(); ++i) EXPECT_NEAR(loss_gas4[i], loss_gas1[i], 1e-5 * std::abs(loss_gas1[i]));
}

TEST(Engine, StepIsNoOpOffTheBoundary) {
  torch::manual_seed(0);
  auto model = Mlp();
  auto engine = initialize(model.ptr(), config_from(R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 3, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})"));
  auto [x, y] = regression_data(6);
  const auto before = flat_params(*model);
  for (int i = 0; i < 2; ++i) {
    EXPECT_FALSE(engine->is_gradient_accumulation_boundary());
    engine->backward(model->loss(x.narrow(0, 2 * i, 2), y.narrow(0, 2 * i, 2)));
    EXPECT_FALSE(engine->step());
    EXPECT_TRUE(torch::equal(before, flat_params(*model)));
  }
  EXPECT_TRUE(engine->is_gradient_accumulation_boundary());
  engine->backward(model->loss(x.narrow(0, 4, 2), y.narrow(0, 4, 2)));
  EXPECT_TRUE(engine->step());
  EXPECT_EQ(engine->global_steps(), 1);
  EXPECT_EQ(engine->micro_steps(), 3);
  EXPECT_FALSE(torch::equal(before, flat_params(*model)));
}

// DeepSpeed's override (Accelerate ending an epoch mid-accumulation): the step on an early boundary applies the
// micro-steps so far, each scaled by 1/gradient_accumulation_steps; std::nullopt gives the count back.
TEST(Engine, AnEarlyBoundaryStepsOnTheMicroStepsSoFar) {
  torch::manual_seed(0);
  auto model = Mlp();
  auto reference = Mlp();
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    torch::NoGradGuard no_grad;
    reference->parameters()[i].copy_(model->parameters()[i]);
  }
  auto engine = initialize(model.ptr(), config_from(R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 3, "gradient_clipping": 0,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})"));
  auto [x, y] = regression_data(4);
  for (int i = 0; i < 2; ++i) {
    engine->set_gradient_accumulation_boundary(i == 1);
    engine->backward(model->loss(x.narrow(0, 2 * i, 2), y.narrow(0, 2 * i, 2)));
    EXPECT_EQ(engine->step(), i == 1);
  }
  EXPECT_EQ(engine->global_steps(), 1);
  // The same two micro-batches by hand: (g0 + g1) / 3, one SGD step.
  auto loss = (reference->loss(x.narrow(0, 0, 2), y.narrow(0, 0, 2)) +
               reference->loss(x.narrow(0, 2, 2), y.narrow(0, 2, 2))) / 3;
  loss.backward();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : reference->parameters()) p.sub_(0.1 * p.grad());
  }
  EXPECT_LT(max_rel_diff(flat_params(*model), flat_params(*reference)), 1e-6);
  EXPECT_TRUE(engine->is_gradient_accumulation_boundary());  // still overridden
  engine->set_gradient_accumulation_boundary(std::nullopt);
  EXPECT_TRUE(engine->is_gradient_accumulation_boundary());  // the count: micro-step 3 of 3 comes next
  engine->set_gradient_accumulation_boundary(false);
  EXPECT_FALSE(engine->is_gradient_accumulation_boundary());
}

// SGD with lr 1 makes the update equal to the (clipped) gradient, so clipping is visible exactly.
TEST(Engine, ClipsToGlobalNormAndReportsPreClipNorm) {
  auto [x, y] = regression_data(8);
  torch::manual_seed(0);
  auto reference = Mlp();
  reference->loss(x, y).backward();
  std::vector<torch::Tensor> grads;
  for (auto& p : reference->parameters()) grads.push_back(p.grad().reshape(-1));
  const auto g = torch::cat(grads);
  const double norm = g.norm().item<double>();
  const double clip = norm / 4;

  torch::manual_seed(0);
  auto model = Mlp();
  const auto before = flat_params(*model);
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 8, "gradient_clipping": )" +
                                                    std::to_string(clip) +
                                                    R"(, "optimizer": {"type": "SGD", "params": {"lr": 1.0}}})"));
  engine->backward(model->loss(x, y));
  engine->step();
  EXPECT_NEAR(engine->last_step().grad_norm, norm, 1e-6 * norm);
  const auto update = before - flat_params(*model);
  EXPECT_LT(max_rel_diff(update, g * (clip / (norm + 1e-6))), 1e-5);
  EXPECT_NEAR(update.norm().item<double>(), clip, 1e-5 * clip);
}

// As DeepSpeed's: the schedule's iteration -1 value for the first step, then one iteration per applied step, so
// step k runs at iteration k - 2; lr() and last_step().lr are what the next step will use (DeepSpeed's get_lr()).
TEST(Engine, ScheduleStepKRunsAtIterationKMinusTwo) {
  torch::manual_seed(0);
  auto model = Mlp();
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 4,
      "optimizer": {"type": "SGD", "params": {"lr": 0.5}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.1,
                                                   "warmup_num_steps": 4, "warmup_type": "linear"}}})"));
  auto [x, y] = regression_data(4);
  // Iterations -1, 0, 1, ...: warmup_min_lr when built, then t / 4 of the way up.
  const std::vector<double> expected = {0.0, 0.0, 0.025, 0.05, 0.075, 0.1, 0.1};
  for (size_t k = 0; k + 1 < expected.size(); ++k) {
    EXPECT_DOUBLE_EQ(engine->lr(), expected[k]) << "before step " << k + 1;
    const auto before = flat_params(*model);
    engine->backward(model->loss(x, y));
    engine->step();
    EXPECT_DOUBLE_EQ(engine->last_step().lr, expected[k + 1]) << "after step " << k + 1;
    // The step ran at expected[k]: at lr 0 nothing moves.
    EXPECT_EQ(torch::equal(before, flat_params(*model)), expected[k] == 0.0) << "step " << k + 1;
  }
}

TEST(Engine, NonFiniteGradientInFp32StopsNamingTheStep) {
  torch::manual_seed(0);
  auto model = Mlp();
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 4,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})"));
  auto [x, y] = regression_data(4);
  engine->backward(model->loss(x, y));
  engine->step();
  x[0][0] = std::numeric_limits<float>::quiet_NaN();
  engine->backward(model->loss(x, y));
  try {
    engine->step();
    FAIL() << "expected NonFiniteGradientError";
  } catch (const NonFiniteGradientError& e) {
    EXPECT_NE(std::string(e.what()).find("step 2"), std::string::npos) << e.what();
  }
}

TEST(Engine, SurvivesUserZeroGradSettingGradsToNone) {
  torch::manual_seed(0);
  auto model = Mlp();
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 4,
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})"));
  auto [x, y] = regression_data(4);
  model->zero_grad();  // LibTorch's default: set_to_none
  const auto before = flat_params(*model);
  engine->backward(model->loss(x, y));
  engine->step();
  EXPECT_GT(engine->last_step().grad_norm, 0.0);
  EXPECT_FALSE(torch::equal(before, flat_params(*model)));
}

TEST(Engine, RejectsFeaturesNotBuiltYetNamingTheKey) {
  auto model = Mlp();
  try {
    initialize(model.ptr(), config_from(R"({"train_batch_size": 4, "wandb": {"enabled": true},
        "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})"));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("wandb.enabled"), std::string::npos) << e.what();
  }
}

// Offloading moves a rank's optimizer partition: stage 0 has none, and partial offload is not built.
TEST(Engine, OffloadErrorsNameTheKeyAndWhatIsAllowed) {
  auto error_of = [](const std::string& zero) {
    auto model = Mlp();
    try {
      initialize(model.ptr(), config_from(R"({"train_batch_size": 4, "zero_optimization": )" + zero +
                                          R"(, "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}})"));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const auto stage0 = error_of(R"({"stage": 0, "offload_optimizer": {"device": "cpu"}})");
  EXPECT_NE(stage0.find("zero_optimization.offload_optimizer.device"), std::string::npos) << stage0;
  EXPECT_NE(stage0.find("stage 1, 2 or 3"), std::string::npos) << stage0;
  const auto ratio = error_of(R"({"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}})");
  EXPECT_NE(ratio.find("zero_optimization.offload_optimizer.ratio"), std::string::npos) << ratio;
  EXPECT_EQ(error_of(R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})"), "no error");
}

// wall_clock_breakdown: every steps_per_print steps one line with each phase per step and per micro-step, and each
// step's times in its report; the parts of backward add up inside it.
TEST(Engine, WallClockBreakdownPrintsEveryPhaseEachPrintWindow) {
  for (bool enabled : {true, false}) {
    auto model = Mlp();
    std::vector<std::string> lines;
    InitOptions options;
    options.log = [&](const std::string& line) { lines.push_back(line); };
    auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 8, "gradient_accumulation_steps": 2,
        "steps_per_print": 2, "wall_clock_breakdown": )" + std::string(enabled ? "true" : "false") + R"(,
        "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"),
                             options);
    auto [x, y] = regression_data(4);
    for (int micro = 0; micro < 8; ++micro) {
      engine->backward(engine->forward([&] { return model->loss(x, y); }));
      engine->step();
    }
    std::vector<std::string> timing;
    for (const auto& line : lines) {
      if (line.find("time (ms)") != std::string::npos) timing.push_back(line);
    }
    if (!enabled) {
      EXPECT_TRUE(timing.empty());
      continue;
    }
    ASSERT_EQ(timing.size(), 2u) << "4 optimizer steps, printed every 2";
    for (const char* key : {"| fwd: ", "| bwd: ", "| bwd_inner: ", "| bwd_allreduce: ", "| step: ", "| fwd_microstep: ",
                            "| bwd_microstep: ", "| bwd_inner_microstep: ", "| bwd_allreduce_microstep: ",
                            "| step_microstep: "}) {
      EXPECT_NE(timing[0].find(key), std::string::npos) << key << " missing from: " << timing[0];
    }
    const auto& t = engine->last_step().times;
    EXPECT_EQ(t.micro_steps, 2);
    EXPECT_EQ(t.steps, 1);
    for (size_t i = 0; i < kPhases; ++i) EXPECT_GT(t.seconds[i], 0.0) << phase_name(static_cast<Phase>(i));
    EXPECT_GE(t[Phase::kBackward], t[Phase::kBackwardInner] + t[Phase::kBackwardAllreduce] - 1e-6);
  }
}

// csv_monitor: DeepSpeed's layout — output_path/job_name/Train_Samples_<name>.csv, header "step,<name>", one row per
// optimizer step at the global sample count, the value exactly the step's.
TEST(Engine, CsvMonitorWritesOneFilePerEventInDeepSpeedsLayout) {
  namespace fs = std::filesystem;
  const auto out = dscpp::testing::temp_dir("csv_monitor");
  auto model = Mlp();
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 4, "wall_clock_breakdown": true,
      "csv_monitor": {"enabled": true, "output_path": ")" + out.string() + R"(", "job_name": "run1"},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"));
  auto [x, y] = regression_data(4);
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) {
    engine->backward(engine->forward([&] { return model->loss(x, y); }));
    engine->step();
    losses.push_back(engine->last_step().loss);
  }
  std::ifstream loss_file(out / "run1" / "Train_Samples_train_loss.csv");
  std::string line;
  ASSERT_TRUE(std::getline(loss_file, line)) << "no Train_Samples_train_loss.csv under " << out;
  EXPECT_EQ(line, "step,train_loss");
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(std::getline(loss_file, line));
    const auto comma = line.find(',');
    EXPECT_EQ(line.substr(0, comma), std::to_string(4 * (step + 1))) << "x is the global sample count";
    EXPECT_EQ(std::stod(line.substr(comma + 1)), losses[step]) << "the value as the step reported it";
  }
  EXPECT_FALSE(std::getline(loss_file, line)) << "one row per step";
  for (const char* name : {"Train_Samples_lr.csv", "Train_Samples_elapsed_time_ms_forward.csv",
                           "Train_Samples_elapsed_time_ms_backward_allreduce.csv", "Train_Samples_elapsed_time_ms_step.csv"}) {
    EXPECT_TRUE(fs::exists(out / "run1" / name)) << name;
  }
  EXPECT_FALSE(fs::exists(out / "run1" / "Train_Samples_loss_scale.csv")) << "only fp16 has a loss scale";

  // An output_path that cannot be a directory is an error naming it.
  std::ofstream(out / "file") << "x";
  try {
    initialize(model.ptr(), config_from(R"({"train_batch_size": 4, "csv_monitor": {"enabled": true,
        "output_path": ")" + (out / "file").string() + R"("}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"));
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find((out / "file").string()), std::string::npos) << e.what();
  }
  fs::remove_all(out);
}

TEST(Engine, RequiresAnOptimizer) {
  auto model = Mlp();
  EXPECT_THROW(initialize(model.ptr(), config_from(R"({"train_batch_size": 4})")), ConfigError);
  InitOptions options;
  options.client_optimizer = OptimizerConfig{"SGD", SgdOptions{}};
  EXPECT_NO_THROW(initialize(model.ptr(), config_from(R"({"train_batch_size": 4})"), options));
}

// assemble's composer form (PipelineEngine's, one engine per stage): the composer gives the groups, so options that
// name a group too are refused naming the field rather than one of the two being dropped.
TEST(Engine, AComposersGroupsRefuseAGroupInTheOptions) {
  const auto config = config_from(R"({"train_batch_size": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})");
  const ParallelLayout::Groups groups{make_single_process_comm(), nullptr, nullptr, nullptr, nullptr};
  for (const char* field : {"comm", "world_group"}) {
    InitOptions options;
    (std::string(field) == "comm" ? options.comm : options.world_group) = make_single_process_comm();
    try {
      assemble(Mlp().ptr(), config, options, groups, ParallelLayout::Names{});
      ADD_FAILURE() << "accepted InitOptions::" << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("InitOptions::") + field + " is set"), std::string::npos)
          << e.what();
    }
  }
  // Without them the engine runs over the composer's data group.
  Engine engine(assemble(Mlp().ptr(), config, InitOptions{}, groups, ParallelLayout::Names{}));
  EXPECT_EQ(&engine.comm(), groups.data.get());
}

TEST(Engine, ReportsModelStateMemory) {
  auto model = Mlp();
  const int64_t n = 8 * 16 + 16 + 16 + 1;
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 4,
      "optimizer": {"type": "Adam", "params": {"lr": 0.1}}})"));
  const auto mem = engine->memory();
  // fp32 stage 0: params are the master (4n), grads (4n), Adam m and v (8n): 16 bytes per parameter.
  EXPECT_EQ(mem.stage.params16, 4 * n);
  EXPECT_EQ(mem.stage.grads16, 4 * n);
  EXPECT_EQ(mem.stage.master, 0);
  EXPECT_EQ(mem.optimizer_state, 8 * n);
  EXPECT_EQ(mem.model_states(), 16 * n);
}

}  // namespace
}  // namespace dscpp::testing

namespace dscpp::testing {
namespace {

// flops_profiler: the profiled step counts exactly the Mlp's products (x·W1ᵀ then h·W2ᵀ, 2 FLOPs per multiply-add)
// over both micro-steps, prints them with an MFU, and no other step is counted.
TEST(Engine, FlopsProfilerCountsTheProfiledStepsForwards) {
  auto model = Mlp();
  std::vector<std::string> lines;
  InitOptions options;
  options.log = [&](const std::string& line) { lines.push_back(line); };
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 8, "gradient_accumulation_steps": 2,
      "flops_profiler": {"enabled": true, "profile_step": 2, "recompute_fwd_factor": 1},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"), options);
  auto [x, y] = regression_data(4);
  for (int micro = 0; micro < 6; ++micro) {
    engine->backward(engine->forward([&] { return model->loss(x, y); }));
    engine->step();
    if (micro == 1) {
      EXPECT_EQ(engine->flops_profile().forward_flops, 0) << "step 1 is not the profiled step";
    }
  }
  const auto& profile = engine->flops_profile();
  EXPECT_EQ(profile.step, 2);
  EXPECT_EQ(profile.micro_steps, 2);
  const int64_t per_micro_step = 2 * 4 * 8 * 16 + 2 * 4 * 16 * 1;
  EXPECT_EQ(profile.forward_flops, 2 * per_micro_step);
  EXPECT_DOUBLE_EQ(profile.step_flops(), 4.0 * 2 * per_micro_step) << "backward 2× and one recompute";
  EXPECT_GT(profile.peak_flops, 0);
  EXPECT_GT(profile.mfu(), 0);
  int printed = 0;
  for (const auto& line : lines) printed += line.find("flops profiler, step 2") != std::string::npos;
  EXPECT_EQ(printed, 1);
}

// memory_breakdown: one line per rank every steps_per_print, naming every part; activations measured.
TEST(Engine, MemoryBreakdownPrintsEveryPartWithMeasuredActivations) {
  auto model = Mlp();
  std::vector<std::string> lines;
  InitOptions options;
  options.log = [&](const std::string& line) { lines.push_back(line); };
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 4, "steps_per_print": 2,
      "memory_breakdown": true, "optimizer": {"type": "Adam", "params": {"lr": 0.01}}})"), options);
  auto [x, y] = regression_data(4);
  for (int step = 0; step < 4; ++step) {
    engine->backward(engine->forward([&] { return model->loss(x, y); }));
    engine->step();
  }
  std::vector<std::string> breakdowns;
  for (const auto& line : lines) {
    if (line.find("memory rank 0:") != std::string::npos) breakdowns.push_back(line);
  }
  ASSERT_EQ(breakdowns.size(), 2u);
  for (const char* part : {"params", "grads", "fp32 master", "optimizer state", "comm buffers", "activations peak",
                           "host offload", "nvme", "rss"}) {
    EXPECT_NE(breakdowns[0].find(part), std::string::npos) << part << " in " << breakdowns[0];
  }
  const auto b = engine->memory_breakdown();
  // At least the (4, 16) hidden activation and its tanh kept for backward.
  EXPECT_GE(b.activations_peak, 2 * 4 * 16 * 4);
  EXPECT_LT(b.activations_peak, 1 << 20);
  EXPECT_EQ(b.nvme, 0);
  EXPECT_GT(b.rss, 0);
  EXPECT_EQ(b.states.optimizer_state, engine->memory().optimizer_state);
}

}  // namespace
}  // namespace dscpp::testing
