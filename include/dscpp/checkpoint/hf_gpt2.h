// Hugging Face GPT-2 weights. HF's GPT-2 names its parameters as we do (wte, wpe, h.N.ln_1, h.N.attn.c_attn, ...,
// ln_f), optionally under "transformer.", but its attention and MLP projections are Conv1D layers whose weight is
// (in, out) — the transpose of our Linear's (out, in). It also stores the causal-mask buffers (h.N.attn.bias,
// h.N.attn.masked_bias) and, in GPT2LMHeadModel files, lm_head.weight tied to wte; none of those are parameters.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dscpp/checkpoint/safetensors.h"

namespace dscpp {

// True for the four Conv1D weights: *.attn.c_attn.weight, *.attn.c_proj.weight, *.mlp.c_fc.weight,
// *.mlp.c_proj.weight.
bool is_hf_gpt2_conv1d_weight(const std::string& name);

// Our value → HF's (Conv1D weights transposed, contiguous); anything else as it is.
torch::Tensor to_hf_gpt2(const std::string& name, const torch::Tensor& value);

// HF GPT-2 weights from a `model.safetensors` file, or a directory holding one or a sharded
// `model.safetensors.index.json`. Tensors are read one at a time, on demand.
class HfGpt2Weights {
 public:
  explicit HfGpt2Weights(const std::string& path);  // throws std::runtime_error naming the path

  // Parameter names found, in our spelling (no "transformer." prefix, buffers and the tied lm_head left out).
  std::vector<std::string> names() const;

  // Parameter `name` (our spelling) in our layout (Conv1D weights transposed back), checked against `shape`.
  // Throws std::runtime_error naming the file and the parameter when it is missing or has another shape.
  torch::Tensor read(const std::string& name, const std::vector<int64_t>& shape) const;

 private:
  struct Location {
    size_t file = 0;
    std::string stored_name;
  };
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, Location> params_;
  std::string path_;
};

// HF's GPT2Config (config.json) for a model of this shape, so `from_pretrained` on the consolidated directory works.
nlohmann::json hf_gpt2_config(int64_t vocab_size, int64_t n_positions, int64_t n_embd, int64_t n_layer,
                              int64_t n_head, double layer_norm_epsilon);

}  // namespace dscpp
