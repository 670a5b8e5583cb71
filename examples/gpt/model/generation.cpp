// generate(): the prompts through the model once, then one position per step from the cache.
#include "model/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace gpt {
namespace {

void check_options(const GenerateOptions& o, int64_t vocab) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("generate: " + what); };
  if (o.max_new_tokens < 0) fail("max_new_tokens must be >= 0, got " + std::to_string(o.max_new_tokens));
  if (!(o.temperature >= 0)) fail("temperature must be >= 0 (0: greedy), got " + std::to_string(o.temperature));
  if (o.top_k < 0) fail("top_k must be >= 0 (0: off), got " + std::to_string(o.top_k));
  if (!(o.top_p > 0 && o.top_p <= 1)) fail("top_p must be in (0, 1], got " + std::to_string(o.top_p));
  if (o.eos_token && (*o.eos_token < 0 || *o.eos_token >= vocab)) {
    fail("eos_token " + std::to_string(*o.eos_token) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
}

}  // namespace

torch::Tensor filter_logits(torch::Tensor logits, int64_t top_k, double top_p) {
  const double minus_inf = -std::numeric_limits<double>::infinity();
  if (top_k > 0 && top_k < logits.size(-1)) {
    const auto kth = std::get<0>(logits.topk(top_k, -1)).narrow(-1, top_k - 1, 1);
    logits = logits.masked_fill(logits < kth, minus_inf);
  }
  if (top_p < 1.0) {
    // Ascending, as HF sorts: a token goes when the tokens below it (itself included) hold at most 1 − top_p.
    const auto [sorted, order] = logits.sort(/*dim=*/-1, /*descending=*/false);
    auto remove = sorted.softmax(-1).cumsum(-1) <= 1.0 - top_p;
    remove.narrow(-1, remove.size(-1) - 1, 1).fill_(false);  // the most likely token stays
    logits = logits.masked_fill(remove.scatter(-1, order, remove), minus_inf);
  }
  return logits;
}

void check_generate(const GptConfig& config, const std::vector<std::vector<int64_t>>& prompts,
                    const GenerateOptions& options) {
  const int64_t vocab = config.data_vocab_size > 0 ? config.data_vocab_size : config.vocab_size;
  check_options(options, vocab);
  if (prompts.empty()) throw std::invalid_argument("generate: no prompts");
  size_t longest = 0;
  for (size_t r = 0; r < prompts.size(); ++r) {
    if (prompts[r].empty()) throw std::invalid_argument("generate: prompt " + std::to_string(r) + " is empty");
    for (const int64_t token : prompts[r]) {
      if (token < 0 || token >= vocab) {
        throw std::invalid_argument("generate: prompt " + std::to_string(r) + " holds token " +
                                    std::to_string(token) + ", outside the vocabulary [0, " + std::to_string(vocab) +
                                    ")");
      }
    }
    longest = std::max(longest, prompts[r].size());
  }
  // The last new token is never fed back: the positions run are the prompt's and all new tokens but the last.
  const int64_t positions = static_cast<int64_t>(longest) + std::max<int64_t>(options.max_new_tokens - 1, 0);
  if (positions > config.block_size) {
    throw std::invalid_argument("generate: the longest prompt (" + std::to_string(longest) + " tokens) and " +
                                std::to_string(options.max_new_tokens) + " new tokens need " +
                                std::to_string(positions) + " positions, more than block_size " +
                                std::to_string(config.block_size));
  }
}

std::vector<std::vector<int64_t>> generate(GptImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerateOptions& options, const CachedForward& forward) {
  check_generate(model.config(), prompts, options);
  const auto& config = model.config();
  const int64_t vocab = config.data_vocab_size > 0 ? config.data_vocab_size : config.vocab_size;
  size_t longest = 0;
  for (const auto& prompt : prompts) longest = std::max(longest, prompt.size());
  const auto device = model.wte->weight.device();
  const int64_t B = static_cast<int64_t>(prompts.size()), T = static_cast<int64_t>(longest);
  auto idx = torch::zeros({B, T}, torch::kLong);
  auto valid = torch::zeros({B, T}, torch::kBool);
  for (int64_t r = 0; r < B; ++r) {  // left padded: every row's next token goes in the same column
    const int64_t n = static_cast<int64_t>(prompts[r].size());
    idx[r].narrow(0, T - n, n).copy_(torch::tensor(prompts[r], torch::kLong));
    valid[r].narrow(0, T - n, n).fill_(true);
  }

  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  struct Restore {
    GptImpl& model;
    bool training;
    ~Restore() { model.train(training); }
  } restore{model, was_training};
  const CachedForward step = forward ? forward : [&model](const torch::Tensor& i, const torch::Tensor& v, KvCache& c) {
    return model.forward_cached(i, v, c);
  };
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  std::vector<std::vector<int64_t>> out(prompts.size());
  std::vector<bool> done(prompts.size(), false);
  KvCache cache;
  auto logits = step(idx.to(device), valid.to(device), cache);
  for (int64_t n = 0; n < options.max_new_tokens; ++n) {
    // fp32 on the host: every rank decides from the same numbers with the same generator.
    auto scores = logits.to(torch::kCPU, torch::kFloat32).narrow(-1, 0, vocab);
    torch::Tensor next;
    if (options.temperature == 0) {
      next = scores.argmax(-1);
    } else {
      const auto probs = filter_logits(scores / options.temperature, options.top_k, options.top_p).softmax(-1);
      next = torch::multinomial(probs, 1, /*replacement=*/false, generator).squeeze(-1);
    }
    bool all_done = true;
    for (int64_t r = 0; r < B; ++r) {
      if (done[r]) {  // a finished row keeps feeding its end token, which nothing reads
        next[r] = *options.eos_token;
        continue;
      }
      const int64_t token = next[r].item<int64_t>();
      out[r].push_back(token);
      done[r] = options.eos_token && token == *options.eos_token;
      all_done = all_done && done[r];
    }
    if (all_done || n + 1 == options.max_new_tokens) break;
    logits = step(next.view({B, 1}).to(device), torch::ones({B, 1}, torch::kBool).to(device), cache);
  }
  return out;
}

}  // namespace gpt
