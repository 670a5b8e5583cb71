// bench/engine_overhead: the same GPT model and batches trained by a plain LibTorch loop (torch::optim::AdamW) and by
// the engine (stage 0, fp32, AdamW), one process. Prints the median step time of each and engine/plain (target ≤ 1.03).
// The two loops alternate in rounds so drift in machine load hits both alike.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "data/batch_sampler.h"
#include "data/token_dataset.h"
#include "dscpp/dscpp.h"
#include "model/gpt.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <typename F>
double time_ms(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"engine overhead vs a plain LibTorch loop"};
  std::string preset = "small";
  int64_t batch = 8, seq_len = 128, rounds = 5, steps_per_round = 6, warmup = 3;
  app.add_option("--model", preset, "gpt preset");
  app.add_option("--batch", batch);
  app.add_option("--seq_len", seq_len);
  app.add_option("--rounds", rounds);
  app.add_option("--steps_per_round", steps_per_round);
  CLI11_PARSE(app, argc, argv);

  auto data = std::make_shared<const gpt::TokenDataset>(gpt::TokenDataset::default_corpus());
  const auto cfg = gpt::GptConfig::preset(preset, data->vocab_size());
  gpt::BatchSamplerOptions sampling;
  sampling.seq_len = seq_len;
  sampling.order = gpt::DataOrder::kSequential;
  const gpt::BatchSampler sampler(data, sampling);
  const double lr = 1e-3, wd = 0.1;

  torch::manual_seed(0);
  auto plain_model = gpt::Gpt(cfg);
  torch::optim::AdamW plain_opt(plain_model->parameters(), torch::optim::AdamWOptions(lr).weight_decay(wd));

  torch::manual_seed(0);
  auto engine_model = gpt::Gpt(cfg);
  dscpp::ConfigOptions options;
  options.warn = [](const std::string&) {};
  auto config = dscpp::Config::from_string(
      R"({"train_batch_size": )" + std::to_string(batch) + R"(, "steps_per_print": 1000000,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}}})",
      options);
  auto engine = dscpp::initialize(engine_model.ptr(), config);

  int64_t step = 0;
  auto plain_step = [&] {
    const auto b = sampler.rows(step++, batch, 0, batch);
    plain_opt.zero_grad();
    plain_model->loss(b.inputs, b.targets).backward();
    plain_opt.step();
  };
  auto engine_step = [&] {
    const auto b = sampler.rows(step++, batch, 0, batch);
    engine->backward(engine_model->loss(b.inputs, b.targets));
    engine->step();
  };
  for (int i = 0; i < warmup; ++i) {
    plain_step();
    engine_step();
  }
  std::vector<double> plain_ms, engine_ms;
  for (int64_t r = 0; r < rounds; ++r) {
    for (int64_t i = 0; i < steps_per_round; ++i) plain_ms.push_back(time_ms(plain_step));
    for (int64_t i = 0; i < steps_per_round; ++i) engine_ms.push_back(time_ms(engine_step));
  }
  const double p = median(plain_ms), e = median(engine_ms);
  std::printf("engine_overhead: model %s (%lld params), batch %lld x seq %lld, %d threads, %lld steps each\n",
              preset.c_str(), static_cast<long long>(cfg.num_params()), static_cast<long long>(batch),
              static_cast<long long>(seq_len), torch::get_num_threads(), static_cast<long long>(plain_ms.size()));
  std::printf("  plain LibTorch loop (torch::optim::AdamW): median %.2f ms/step\n", p);
  std::printf("  dscpp engine (stage 0, fp32, AdamW):       median %.2f ms/step\n", e);
  std::printf("  ratio engine/plain: %.3f (target <= 1.03)\n", e / p);
  return 0;
}
