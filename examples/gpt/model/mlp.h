// The GPT-2 feed-forward block: Linear(C, 4C) → GELU (tanh approximation) → Linear(4C, C).
#pragma once

#include <torch/torch.h>

#include <memory>

#include "dscpp/comm/comm.h"
#include "dscpp/compression/linear_compression.h"
#include "model/gpt_config.h"

namespace gpt {

// Tensor parallel over `group` (p ranks): rank r holds rows [r·4C/p, (r+1)·4C/p) of c_fc (column-parallel) and the
// matching columns of c_proj (row-parallel, its bias whole). Cloneable: an MoE block deep-copies it for every expert.
class MlpImpl : public torch::nn::Cloneable<MlpImpl> {
 public:
  explicit MlpImpl(const GptConfig& config, std::shared_ptr<dscpp::Comm> group = nullptr);
  void reset() override;  // (re)builds c_fc and c_proj

  // x: (B, T, C) → (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);
  // Keeps this rank's slices of the whole, initialised weights (called once, right after initialisation).
  void keep_own_slices();
  // DeepSpeed-Ulysses: x holds this rank's positions of longer sequences; the dropout mask is the whole sequences'.
  void set_sequence_group(std::shared_ptr<dscpp::Comm> group) { sequence_group_ = std::move(group); }

  torch::nn::Linear c_fc{nullptr};    // (4C/p, C)
  torch::nn::Linear c_proj{nullptr};  // (C, 4C/p)
  // DeepSpeed Compression of the two layers (gpt-train with compression_training; null: none).
  std::shared_ptr<dscpp::compression::LinearCompression> c_fc_compression, c_proj_compression;

 private:
  int64_t n_embd_;
  double dropout_;
  std::shared_ptr<dscpp::Comm> group_;
  std::shared_ptr<dscpp::Comm> sequence_group_;
};
TORCH_MODULE(Mlp);

}  // namespace gpt
