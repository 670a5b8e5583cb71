// gpt-train --generate: flags, checks, and the generation through the engine.
#include "text_generation.h"

#include <nlohmann/json.hpp>

#include <iostream>
#include <stdexcept>

namespace gpt {

void add_generation_flags(CLI::App& app, TextGeneration& g) {
  app.add_option("--generate", g.prompt,
                 "after training, continue this text with the trained model (key/value cache; greedy unless "
                 "--temperature) and print it as JSON on stdout; with --load_dir and --steps at the checkpoint's "
                 "step, a trained model generates without training");
  app.add_option("--max_new_tokens", g.options.max_new_tokens, "--generate: tokens to add (32)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", g.options.temperature, "--generate: 0 greedy (default); above 0 sample (seeded by --seed)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top_k", g.options.top_k, "--generate: sample among the k most likely tokens (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top_p", g.options.top_p, "--generate: sample among the fewest tokens holding this probability (1: all)")
      ->check(CLI::Range(0.0, 1.0));
}

namespace {

std::vector<int64_t> prompt_tokens(const std::string& text) {
  std::vector<int64_t> tokens;
  for (const char c : text) tokens.push_back(static_cast<unsigned char>(c));
  return tokens;
}

}  // namespace

void check_generation(const TextGeneration& g, int pipeline_parallel, int sequence_parallel, bool sparse_attention,
                      const TokenDataset& data, const GptConfig& model) {
  if (g.prompt.empty()) return;
  if (pipeline_parallel > 1 || sequence_parallel > 1 || sparse_attention) {
    throw std::invalid_argument("--generate with --pipeline_parallel, --sequence_parallel or sparse attention is not "
                                "supported yet");
  }
  if (data.vocab_size() != TokenDataset::kByteVocabSize) {
    throw std::invalid_argument("--generate takes a text prompt, whose tokens are its bytes; this run's data is " +
                                data.description() + ", which is not text");
  }
  check_generate(model, {prompt_tokens(g.prompt)}, g.options);
}

void generate_text(const TextGeneration& g, uint64_t seed, GptImpl& model, dscpp::Engine& engine, int rank) {
  const auto prompt = prompt_tokens(g.prompt);
  auto options = g.options;
  options.seed = seed;
  const auto tokens = generate(model, {prompt}, options,
                               [&](const torch::Tensor& idx, const torch::Tensor& valid, KvCache& cache) {
                                 return engine.forward([&] { return model.forward_cached(idx, valid, cache); });
                               })[0];
  if (rank != 0) return;
  std::string text;
  for (const int64_t t : tokens) text.push_back(static_cast<char>(t));
  const nlohmann::json line = {{"prompt", g.prompt}, {"tokens", tokens}, {"text", text}};
  // Bytes that are not UTF-8 (a small model's output may hold any) print as U+FFFD.
  std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
}

}  // namespace gpt
