// GptConfig presets, validation and the closed-form parameter count.
#include "model/gpt_config.h"

#include <stdexcept>

namespace gpt {
namespace {

struct Preset {
  const char* name;
  int64_t n_layer, n_head, n_embd, block_size;
};

// tiny: ~0.84M params with V=256, for tests and smoke runs.
// small: ~4.9M params with V=256. Measured on a shared 2-core CPU (LibTorch 1.13, 1 intra-op thread, fp32,
//   micro-batch 8 × seq 128, AdamW): ~0.55 s per optimizer step, loss on the embedded corpus 5.6 → ~2.8 in
//   150 steps (~85 s). 6 × 384 (10.8M) took ~1.0 s per step, too slow for a one-minute demo.
// gpt2*: HF's GPT-2 family (n_positions 1024).
constexpr Preset kPresets[] = {
    {"tiny", 4, 4, 128, 128},      {"small", 6, 8, 256, 256},
    {"gpt2", 12, 12, 768, 1024},   {"gpt2-medium", 24, 16, 1024, 1024},
    {"gpt2-large", 36, 20, 1280, 1024}, {"gpt2-xl", 48, 25, 1600, 1024},
};

void require_positive(int64_t value, const char* flag) {
  if (value <= 0) {
    throw std::invalid_argument(std::string("gpt config: ") + flag + " must be > 0, got " + std::to_string(value));
  }
}

}  // namespace

std::vector<std::string> GptConfig::preset_names() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.name);
  return names;
}

GptConfig GptConfig::preset(const std::string& name, int64_t vocab_size) {
  for (const auto& p : kPresets) {
    if (name == p.name) {
      GptConfig config;
      config.vocab_size = vocab_size;
      config.block_size = p.block_size;
      config.n_layer = p.n_layer;
      config.n_head = p.n_head;
      config.n_embd = p.n_embd;
      config.validate();
      return config;
    }
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("--model: unknown preset '" + name + "'; known presets: " + known);
}

void GptConfig::validate() const {
  require_positive(vocab_size, "vocab_size");
  if (data_vocab_size < 0 || data_vocab_size > vocab_size) {
    throw std::invalid_argument("gpt config: the data's vocabulary (" + std::to_string(data_vocab_size) +
                                " tokens) does not fit the model's " + std::to_string(vocab_size) + "-row embedding");
  }
  require_positive(block_size, "--seq_len/block_size");
  require_positive(n_layer, "--n_layer");
  require_positive(n_head, "--n_head");
  require_positive(n_embd, "--n_embd");
  if (moe_experts < 0) throw std::invalid_argument("gpt config: --moe_experts must be >= 0, got " + std::to_string(moe_experts));
  if (moe_experts > 0 && moe_experts < moe_top_k) {
    throw std::invalid_argument("gpt config: --moe_experts " + std::to_string(moe_experts) + " is fewer than --moe_top_k " +
                                std::to_string(moe_top_k));
  }
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    throw std::invalid_argument("gpt config: --dropout " + std::to_string(dropout) + " must be in [0, 1)");
  }
  if (n_embd % n_head != 0) {
    throw std::invalid_argument("gpt config: --n_embd " + std::to_string(n_embd) + " is not divisible by --n_head " +
                                std::to_string(n_head) + "; choose n_embd a multiple of n_head");
  }
  if (!(layer_norm_eps > 0.0)) {
    throw std::invalid_argument("gpt config: layer_norm_eps must be > 0, got " + std::to_string(layer_norm_eps));
  }
}

int64_t GptConfig::forward_flops(int64_t T) const {
  const int64_t C = n_embd;
  const int64_t mlp = 16 * T * C * C;
  int64_t moe_extra = 0;  // per MoE block, beyond a dense block's one MLP
  if (moe_experts > 0) {
    moe_extra = (moe_top_k - 1) * mlp + 2 * T * C * moe_experts;
    if (moe_use_residual) moe_extra += mlp + 2 * T * C * 2;
  }
  return n_layer * (24 * T * C * C + 4 * T * T * C) + moe_blocks() * moe_extra + 2 * T * C * vocab_size;
}

namespace {
int64_t mlp_params(int64_t C) { return (C * 4 * C + 4 * C) + (4 * C * C + C); }  // c_fc + c_proj
}  // namespace

int64_t GptConfig::num_expert_params() const { return moe_blocks() * moe_experts * mlp_params(n_embd); }

int64_t GptConfig::num_params() const {
  const int64_t C = n_embd;
  const int64_t layer_norm = 2 * C;
  const int64_t attention = (C * 3 * C + 3 * C) + (C * C + C);  // c_attn + c_proj
  const int64_t block = 2 * layer_norm + attention + mlp_params(C);
  // An MoE block: the experts and the gate (E × C) instead of the MLP; the residual keeps the MLP and adds the
  // coefficient (2 × C + 2).
  const int64_t moe_extra = moe_experts * C - (moe_use_residual ? -(2 * C + 2) : mlp_params(C));
  return vocab_size * C + block_size * C + n_layer * block + moe_blocks() * moe_extra + num_expert_params() +
         layer_norm;  // wte, wpe, h.*, ln_f
}

int64_t GptConfig::num_params_per_rank(int tensor_parallel) const {
  const int64_t C = n_embd;
  // wpe; per block ln_1, ln_2 and the two row-parallel biases; ln_f.
  const int64_t whole = block_size * C + n_layer * (4 * C + 2 * C) + 2 * C;
  return whole + (num_params() - whole) / tensor_parallel;
}

}  // namespace gpt
