// Generation from the GPT: prompts in, new tokens out, with a key/value cache (each step computes only the new
// position) and Hugging Face generate's choices — greedy, or sampling with temperature, top-k and top-p from a
// seeded generator, stopping at an end token. Every rank that runs it with the same seed picks the same tokens
// (tensor-parallel ranks see the same gathered logits; sampling draws from a generator of its own, not the global
// one), so a model sliced or partitioned over ranks generates what one process generates.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "model/gpt.h"
#include "model/kv_cache.h"

namespace gpt {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  double temperature = 0.0;  // 0: greedy (the most likely token; the first of equals); > 0: sample
  int64_t top_k = 0;         // sampling: keep the k most likely tokens (0: all)
  double top_p = 1.0;        // sampling: keep the fewest most likely tokens whose probability reaches p (HF's top-p)
  uint64_t seed = 0;         // sampling's generator
  std::optional<int64_t> eos_token;  // a row ends after it produces this token (kept as its last)
};

// Sampling's filter, as HF's TopKLogitsWarper then TopPLogitsWarper: `logits` (B, V) with the tokens top-k and top-p
// remove set to -inf (the most likely token always stays). Exposed for its tests.
torch::Tensor filter_logits(torch::Tensor logits, int64_t top_k, double top_p);

// What generate() refuses, checked alone (a program can check before it trains): std::invalid_argument for an
// empty prompt, a token outside the data's vocabulary, more positions than block_size, or options out of range.
void check_generate(const GptConfig& config, const std::vector<std::vector<int64_t>>& prompts,
                    const GenerateOptions& options);

// One forward of generation: the model's forward_cached, or the same inside an engine's forward (ZeRO-3 gathers
// each block in it, and releases them when the forward ends).
using CachedForward = std::function<torch::Tensor(const torch::Tensor& idx, const torch::Tensor& valid, KvCache&)>;

// Each prompt's new tokens (at most max_new_tokens; up to and including eos_token). Prompts may differ in length
// (left padded together). The model runs in eval mode without gradients and is put back as it was. `forward`
// defaults to model.forward_cached. std::invalid_argument as check_generate says, naming what is wrong.
std::vector<std::vector<int64_t>> generate(GptImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                                           const GenerateOptions& options, const CachedForward& forward = {});

}  // namespace gpt
