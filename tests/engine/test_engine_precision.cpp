// Engine mixed precision: fp16 with the dynamic loss scaler (skips, scale sequence, schedule held on skipped
// steps) and bf16 with fp32 master weights. fp16 uses an elementwise model (test_models.h).
#include <gtest/gtest.h>

#include <limits>

#include "dscpp/dscpp.h"
#include "dscpp/monitor/memory_tracker.h"
#include "test_models.h"

namespace dscpp::testing {
namespace {

// The same values, compared in fp32.
bool same_values(const torch::Tensor& a, const torch::Tensor& b) {
  return torch::equal(a.to(torch::kFloat32), b.to(torch::kFloat32));
}

TEST(EnginePrecision, Fp16DynamicScalerSkipsOverflowingStepsExactly) {
  torch::manual_seed(0);
  auto model = Elementwise(32);
  std::vector<std::string> log;
  InitOptions init;
  init.log = [&](const std::string& line) {
    if (line.find("overflow") != std::string::npos) log.push_back(line);
  };
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 4,
      "fp16": {"enabled": true, "initial_scale_power": 4, "loss_scale_window": 3, "hysteresis": 2},
      "optimizer": {"type": "SGD", "params": {"lr": 1.0}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 8.0,
                                                   "warmup_num_steps": 8, "warmup_type": "linear"}}})"),
                           init);
  EXPECT_EQ(engine->compute_dtype(), torch::kFloat16);
  EXPECT_EQ(model->w.scalar_type(), torch::kFloat16);

  torch::manual_seed(1);
  auto x = torch::randn({4, 32}) * 0.1;
  auto y = torch::randn({4, 32}) * 0.1;
  auto x_inf = x.clone();
  x_inf[0][0] = std::numeric_limits<float>::infinity();

  const std::vector<bool> overflow = {false, true, true, false, false, false, false};
  const std::vector<double> scale = {16, 16, 16, 8, 8, 8, 16};   // hysteresis absorbs the first overflow
  // The lr after each step (what the next will use): the schedule moves only on applied steps, and the first two
  // applied steps run at iterations -1 and 0 (both warmup_min_lr).
  const std::vector<double> lr = {0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0};
  for (size_t i = 0; i < overflow.size(); ++i) {
    const auto before = model->w.detach().clone();
    const double ran_at = engine->lr();
    engine->backward(model->loss(overflow[i] ? x_inf : x, y));
    const bool stepped = engine->step();
    const auto& r = engine->last_step();
    EXPECT_EQ(r.skipped, overflow[i]) << "step " << i + 1;
    EXPECT_EQ(stepped, !overflow[i]) << "step " << i + 1;
    EXPECT_DOUBLE_EQ(r.loss_scale, scale[i]) << "step " << i + 1;
    EXPECT_NEAR(r.lr, lr[i], 1e-12) << "step " << i + 1;
    if (overflow[i]) {
      EXPECT_TRUE(same_values(before, model->w.detach())) << "params must not move on a skipped step";
    } else if (ran_at > 0) {
      EXPECT_FALSE(same_values(before, model->w.detach())) << "step " << i + 1;
      EXPECT_TRUE(std::isfinite(r.grad_norm));
    }
  }
  EXPECT_EQ(engine->skipped_steps(), 2);
  EXPECT_EQ(engine->global_steps(), 7);
  EXPECT_EQ(log.size(), 2u) << "one line per overflow";
}

TEST(EnginePrecision, Fp16GradientsAreUnscaledBeforeTheUpdate) {
  // Same data, fp16 with scale 2^10 vs fp32: SGD updates must agree to fp16 precision.
  auto run = [](const std::string& precision) {
    torch::manual_seed(0);
    auto model = Elementwise(32);
    auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 4, )" + precision +
                                                      R"( "optimizer": {"type": "SGD", "params": {"lr": 5.0}}})"));
    torch::manual_seed(1);
    auto x = torch::randn({4, 32}) * 0.5;
    auto y = torch::randn({4, 32}) * 0.5;
    for (int i = 0; i < 3; ++i) {
      engine->backward(model->loss(x, y));
      engine->step();
    }
    return std::make_pair(model->w.detach().to(torch::kCPU, torch::kFloat32), engine->last_step().grad_norm);
  };
  auto [w16, norm16] = run(R"("fp16": {"enabled": true, "initial_scale_power": 10},)");
  auto [w32, norm32] = run("");
  const auto initial = torch::linspace(0.5, 1.5, 32);
  ASSERT_GT((w32 - initial).abs().max().item<double>(), 0.1) << "the updates must be large enough to compare";
  EXPECT_LT((w16 - w32).abs().max().item<double>(), 5e-3);
  EXPECT_NEAR(norm16, norm32, 1e-2 * norm32);
}

TEST(EnginePrecision, Fp16StaticScaleStaysAndSkips) {
  torch::manual_seed(0);
  auto model = Elementwise(8);
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 2,
      "fp16": {"enabled": true, "loss_scale": 128}, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})"));
  auto x = torch::ones({2, 8});
  auto y = torch::zeros({2, 8});
  engine->backward(model->loss(x * std::numeric_limits<float>::infinity(), y));
  EXPECT_FALSE(engine->step());
  EXPECT_TRUE(engine->last_step().skipped);
  EXPECT_DOUBLE_EQ(engine->loss_scale(), 128);
  engine->backward(model->loss(x, y));
  EXPECT_TRUE(engine->step());
  EXPECT_DOUBLE_EQ(engine->loss_scale(), 128);
}

TEST(EnginePrecision, Fp16AtMinimumScaleIsAClearError) {
  torch::manual_seed(0);
  auto model = Elementwise(8);
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 2,
      "fp16": {"enabled": true, "initial_scale_power": 1, "hysteresis": 1, "min_loss_scale": 1},
      "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})"));
  auto x = torch::full({2, 8}, std::numeric_limits<float>::infinity());
  auto y = torch::zeros({2, 8});
  engine->backward(model->loss(x, y));
  engine->step();  // 2 -> 1
  EXPECT_DOUBLE_EQ(engine->loss_scale(), 1);
  engine->backward(model->loss(x, y));
  EXPECT_THROW(engine->step(), LossScaleAtMinimumError);
}

TEST(EnginePrecision, Bf16TrainsWithFp32Master) {
  torch::manual_seed(0);
  auto model = Mlp();
  auto engine = initialize(model.ptr(), config_from(R"({"train_batch_size": 32, "bf16": {"enabled": true},
      "optimizer": {"type": "Adam", "params": {"lr": 0.02}}})"));
  EXPECT_EQ(model->fc1->weight.scalar_type(), torch::kBFloat16);
  const int64_t n = 8 * 16 + 16 + 16 + 1;
  const auto mem = engine->memory();
  EXPECT_EQ(mem.stage.params16, 2 * n);
  EXPECT_EQ(mem.stage.grads16, 2 * n);
  EXPECT_EQ(mem.stage.master, 4 * n);
  auto [x, y] = regression_data(32);
  std::vector<double> losses;
  for (int i = 0; i < 60; ++i) {
    engine->backward(model->loss(x, y));
    engine->step();
    losses.push_back(engine->last_step().loss);
  }
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << "first " << losses.front() << " last " << losses.back();
}

// A model whose matmuls are large enough for oneDNN's bf16 kernel where the CPU has AVX-512 (above 16³
// multiply-adds); oneDNN takes scratch memory through the CPU allocator's raw interface.
struct WideMlpImpl : torch::nn::Module {
  WideMlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(64, 256));
    fc2 = register_module("fc2", torch::nn::Linear(256, 1));
    to(test_device());
  }
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& y) {
    const auto out = fc2->forward(torch::tanh(fc1->forward(x.to(fc1->weight.device(), fc1->weight.scalar_type()))));
    return torch::mse_loss(out.to(torch::kFloat32), y.to(out.device()));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(WideMlp);

// "memory_breakdown": true puts the counting CPU allocator in front of LibTorch's. bf16 training then goes as it
// does without it, bit for bit (it aborted in oneDNN's raw_allocate on AVX-512 CPUs), and the activations are
// measured. The run without comes first: the allocator stays for the rest of the process.
TEST(EnginePrecision, Bf16WithMemoryBreakdownTrainsExactlyAsWithout) {
  if (CpuMemoryTracker::installed()) GTEST_SKIP() << "needs a process of its own (ctest gives each test one)";
  torch::manual_seed(3);
  const auto x = torch::randn({32, 64});
  const auto y = x.narrow(1, 0, 1).sin();
  const auto train = [&](bool memory_breakdown, int64_t* activations_peak) {
    torch::manual_seed(0);
    auto model = WideMlp();
    InitOptions init;
    init.log = [](const std::string&) {};
    auto engine = initialize(model.ptr(), config_from(std::string(R"({"train_batch_size": 32, "bf16": {"enabled": true},
        "optimizer": {"type": "Adam", "params": {"lr": 0.01}}, "memory_breakdown": )") +
                                                      (memory_breakdown ? "true" : "false") + "}"),
                             init);
    std::vector<double> losses;
    for (int i = 0; i < 8; ++i) {
      engine->backward(engine->forward([&] { return model->loss(x, y); }));
      engine->step();
      losses.push_back(engine->last_step().loss);
    }
    *activations_peak = engine->memory_breakdown().activations_peak;
    return losses;
  };
  int64_t peak_without = 0, peak_with = 0;
  const auto without = train(false, &peak_without);
  const auto with = train(true, &peak_with);
  EXPECT_TRUE(CpuMemoryTracker::installed());
  EXPECT_EQ(with, without);
  EXPECT_LT(with.back(), with.front());
  EXPECT_GE(peak_with, 32 * 256 * 2) << "at least the bf16 hidden activation, kept for backward";
  EXPECT_LT(peak_with, 1 << 20);
}

}  // namespace
}  // namespace dscpp::testing
