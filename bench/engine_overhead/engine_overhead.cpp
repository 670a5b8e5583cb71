// bench/engine_overhead: the same GPT model and batches trained, in one process, by the engine at each ZeRO stage
// (fp32, AdamW, through engine->forward / backward / step, each block through run_unit) and by two plain LibTorch
// loops a user could write instead:
//   flat       the strongest plain loop: every parameter a view of one contiguous buffer, every gradient a view of
//              another, and AdamW as a handful of whole-buffer tensor ops (what torch's foreach/fused AdamW does);
//   per-tensor torch::optim::AdamW over the parameters as the model made them.
// All configurations alternate in rounds (A B C … A B C …), so machine load hits them alike; each round's median
// step time gives each round's ratios engine/flat and engine/per-tensor, printed with min / median / max over rounds,
// and minor page faults and system time per step from getrusage over that configuration's steps.
// One process, so the malloc thresholds dscpp::initialize sets hold for the plain loops too: this measures the
// engine's own work; bench/python_baseline compares whole processes.
// Expected time on a 2-core machine with the defaults (small, 5 rounds x 6 steps, stages 0-3): ~3 min.
#include <CLI/CLI.hpp>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iomanip>
#include <sstream>

#include "data/batch_sampler.h"
#include "data/token_dataset.h"
#include "dscpp/dscpp.h"
#include "model/gpt.h"

namespace {

constexpr double kLr = 1e-3, kWeightDecay = 0.1, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[(v.size() - 1) / 2];
}

// AdamW (decoupled decay, bias-corrected) over one flat buffer: the parameters become views into `params_`, their
// gradients views into `grads_`, which backward accumulates into in place. Four passes of whole-buffer ops and no
// allocation per step, as torch's fused AdamW on one flat parameter.
class FlatAdamW {
 public:
  explicit FlatAdamW(const std::vector<torch::Tensor>& params) {
    int64_t total = 0;
    for (const auto& p : params) total += p.numel();
    params_ = torch::empty({total});
    grads_ = torch::zeros({total});
    exp_avg_ = torch::zeros({total});
    exp_avg_sq_ = torch::zeros({total});
    denom_ = torch::empty({total});
    int64_t offset = 0;
    torch::NoGradGuard no_grad;
    for (auto p : params) {
      const int64_t n = p.numel();
      auto view = params_.narrow(0, offset, n).view(p.sizes());
      view.copy_(p);
      p.set_data(view);
      p.mutable_grad() = grads_.narrow(0, offset, n).view(p.sizes());
      offset += n;
    }
  }

  void zero_grad() { grads_.zero_(); }

  void step() {
    torch::NoGradGuard no_grad;
    ++step_;
    const double bias1 = 1.0 - std::pow(kBeta1, step_), bias2 = 1.0 - std::pow(kBeta2, step_);
    exp_avg_.mul_(kBeta1).add_(grads_, 1.0 - kBeta1);
    exp_avg_sq_.mul_(kBeta2).addcmul_(grads_, grads_, 1.0 - kBeta2);
    params_.mul_(1.0 - kLr * kWeightDecay);
    torch::sqrt_out(denom_, exp_avg_sq_).div_(std::sqrt(bias2)).add_(kEps);
    params_.addcdiv_(exp_avg_, denom_, -kLr / bias1);
  }

 private:
  torch::Tensor params_, grads_, exp_avg_, exp_avg_sq_, denom_;
  int64_t step_ = 0;
};

// One configuration: a step function and what its steps measured.
struct Runner {
  std::string name;
  std::function<torch::Tensor(int64_t step)> step;  // returns the step's loss
  std::vector<double> round_ms{};  // the median step time of each round
  double faults = 0, sys_s = 0;  // summed over all measured steps
  int64_t steps = 0;
  double last_loss = 0;
};

struct Usage {
  double faults, sys_s;
};

Usage usage_now() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {static_cast<double>(u.ru_minflt), u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6};
}

void print_ratio(const std::string& label, const std::vector<double>& per_round, const char* note) {
  std::ostringstream rounds;
  for (double r : per_round) rounds << ' ' << std::fixed << std::setprecision(3) << r;
  const auto [lo, hi] = std::minmax_element(per_round.begin(), per_round.end());
  std::printf("  %s:%s -> min / median / max %.3f / %.3f / %.3f %s\n", label.c_str(), rounds.str().c_str(), *lo,
              median(per_round), *hi, note);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the engine at each ZeRO stage vs plain LibTorch loops, one process"};
  std::string preset = "small";
  int64_t batch = 8, seq_len = 128, rounds = 5, steps_per_round = 6, warmup = 3;
  std::vector<int> stages = {0, 1, 2, 3};
  app.add_option("--model", preset, "gpt preset");
  app.add_option("--batch", batch);
  app.add_option("--seq_len", seq_len);
  app.add_option("--rounds", rounds)->check(CLI::PositiveNumber);
  app.add_option("--steps_per_round", steps_per_round)->check(CLI::PositiveNumber);
  app.add_option("--stages", stages, "ZeRO stages to run")->delimiter(',')->check(CLI::Range(0, 3));
  CLI11_PARSE(app, argc, argv);

  auto data = std::make_shared<const gpt::TokenDataset>(gpt::TokenDataset::default_corpus());
  const auto cfg = gpt::GptConfig::preset(preset, data->vocab_size());
  gpt::BatchSamplerOptions sampling;
  sampling.seq_len = seq_len;
  sampling.order = gpt::DataOrder::kSequential;
  const gpt::BatchSampler sampler(data, sampling);
  auto batch_at = [&](int64_t step) { return sampler.rows(step, batch, 0, batch); };

  std::vector<Runner> runners;
  // Every model starts from the same weights and sees the same batches, so the loops do the same arithmetic.
  torch::manual_seed(0);
  auto flat_model = gpt::Gpt(cfg);
  auto flat_opt = std::make_shared<FlatAdamW>(flat_model->parameters());
  runners.push_back({"flat", [&, flat_model, flat_opt](int64_t step) mutable {
                       const auto b = batch_at(step);
                       flat_opt->zero_grad();
                       auto loss = flat_model->loss(b.inputs, b.targets);
                       loss.backward();
                       flat_opt->step();
                       return loss;
                     }});
  torch::manual_seed(0);
  auto torch_model = gpt::Gpt(cfg);
  auto torch_opt = std::make_shared<torch::optim::AdamW>(
      torch_model->parameters(), torch::optim::AdamWOptions(kLr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(
                                     kWeightDecay));
  runners.push_back({"per_tensor", [&, torch_model, torch_opt](int64_t step) mutable {
                       const auto b = batch_at(step);
                       torch_opt->zero_grad();
                       auto loss = torch_model->loss(b.inputs, b.targets);
                       loss.backward();
                       torch_opt->step();
                       return loss;
                     }});

  std::vector<std::unique_ptr<dscpp::Engine>> engines;
  std::vector<gpt::Gpt> engine_models;
  for (int stage : stages) {
    torch::manual_seed(0);
    auto model = gpt::Gpt(cfg);
    dscpp::ConfigOptions options;
    options.warn = [](const std::string&) {};
    auto config = dscpp::Config::from_string(
        R"({"train_batch_size": )" + std::to_string(batch) + R"(, "steps_per_print": 1000000,
            "zero_optimization": {"stage": )" + std::to_string(stage) + R"(, "reduce_bucket_size": 5e5},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}}})",
        options);
    dscpp::InitOptions init;
    init.log = [](const std::string&) {};
    for (const auto& block : model->blocks()) init.gather_units.push_back(block.ptr());
    engines.push_back(dscpp::initialize(model.ptr(), config, init));
    dscpp::Engine* engine = engines.back().get();
    model->set_block_runner([engine](const gpt::Block& block, const torch::Tensor& x) {
      return engine->run_unit(*block, [unit = block.ptr(), &x] { return unit->forward(x); });
    });
    engine_models.push_back(model);
    runners.push_back({"stage" + std::to_string(stage), [&, engine, model = model.ptr()](int64_t step) {
                         const auto b = batch_at(step);
                         auto loss = engine->forward([&] { return model->loss(b.inputs, b.targets); });
                         engine->backward(loss);
                         engine->step();
                         return loss;
                       }});
  }

  int64_t step = 0;
  for (int64_t i = 0; i < warmup; ++i, ++step) {
    for (auto& r : runners) r.step(step);
  }
  for (int64_t round = 0; round < rounds; ++round) {
    for (auto& r : runners) {
      std::vector<double> ms;
      const Usage before = usage_now();
      for (int64_t i = 0; i < steps_per_round; ++i) {
        const auto start = std::chrono::steady_clock::now();
        r.last_loss = r.step(step + i).item<double>();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
      const Usage after = usage_now();
      r.round_ms.push_back(median(ms));
      r.faults += after.faults - before.faults;
      r.sys_s += after.sys_s - before.sys_s;
      r.steps += steps_per_round;
    }
    step += steps_per_round;
  }

  std::printf("engine_overhead: model %s (%lld params), batch %lld x seq %lld, %d threads, %lld rounds x %lld steps\n",
              preset.c_str(), static_cast<long long>(cfg.num_params()), static_cast<long long>(batch),
              static_cast<long long>(seq_len), torch::get_num_threads(), static_cast<long long>(rounds),
              static_cast<long long>(steps_per_round));
  for (const auto& r : runners) {
    std::printf("  %-10s median %8.2f ms/step  %8.0f faults/step %6.2f sys ms/step  last loss %.6f\n",
                r.name.c_str(), median(r.round_ms), r.faults / r.steps, 1000 * r.sys_s / r.steps, r.last_loss);
  }
  const Runner& flat = runners[0];
  const Runner& per_tensor = runners[1];
  for (size_t k = 2; k < runners.size(); ++k) {
    std::vector<double> vs_flat, vs_torch;
    for (int64_t round = 0; round < rounds; ++round) {
      vs_flat.push_back(runners[k].round_ms[round] / flat.round_ms[round]);
      vs_torch.push_back(runners[k].round_ms[round] / per_tensor.round_ms[round]);
    }
    print_ratio(runners[k].name + " / flat", vs_flat, "(target <= 1.03)");
    print_ratio(runners[k].name + " / per_tensor", vs_torch, "");
  }
  return 0;
}
