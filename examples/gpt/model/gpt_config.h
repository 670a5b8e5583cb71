// GptConfig: the shape of a GPT-2-architecture decoder, with named presets (tiny … gpt2-xl).
// Field names follow HF's GPT2Config so a config.json maps one to one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

struct GptConfig {
  int64_t vocab_size = 256;      // V: 256 for byte text, 50257 for GPT-2 tokens; the embedding table's rows
  int64_t block_size = 128;      // longest sequence the position table covers (HF n_positions)
  int64_t n_layer = 4;           // L: transformer blocks
  int64_t n_head = 4;            // attention heads; n_embd must be divisible by it
  int64_t n_embd = 128;          // C: residual stream width
  double layer_norm_eps = 1e-5;  // HF layer_norm_epsilon
  // Dropout probability after the embeddings, on the attention weights and on each residual branch (HF's
  // embd_pdrop, attn_pdrop and resid_pdrop, one value for the three). 0: none. Active only in training mode.
  double dropout = 0.0;
  // The tokens the data can hold when the table is padded larger (llm.c's 50257 in a 50304-row table): the loss's
  // softmax covers only these, so the padding rows never get probability. 0: all of vocab_size.
  int64_t data_vocab_size = 0;
  // Mixture of Experts, as DeepSpeed-MoE's GPT: every other block (1, 3, …) has moe_experts copies of the MLP and a
  // gate in its MLP's place (dscpp::moe::MoE, named h.<i>.mlp.deepspeed_moe.…), each token going to moe_top_k of
  // them; with moe_use_residual the dense MLP is kept beside them (Residual-MoE). 0 experts: a dense model.
  int64_t moe_experts = 0;
  int moe_top_k = 1;
  bool moe_use_residual = false;
  bool is_moe_block(int64_t block) const { return moe_experts > 0 && block % 2 == 1; }
  int64_t moe_blocks() const { return moe_experts > 0 ? n_layer / 2 : 0; }

  // A named preset with the data's vocabulary. Throws std::invalid_argument listing the known names.
  static GptConfig preset(const std::string& name, int64_t vocab_size);
  static constexpr const char* kDefaultPreset = "small";  // gpt-train's --model
  static std::vector<std::string> preset_names();

  // Throws std::invalid_argument naming the flag (--n_embd, --n_head, ...) when a field is out of range.
  void validate() const;

  // Exact parameter count of GptImpl with this config (LM head tied to wte, so counted once; every expert).
  int64_t num_params() const;
  // The experts' share of num_params(): what expert parallelism spreads over its ranks.
  int64_t num_expert_params() const;
  // The parameters one rank holds when the model is sliced over `tensor_parallel` ranks (GptImpl's layout: wte,
  // c_attn, the c_proj weights and c_fc divided; wpe, the LayerNorms and the c_proj biases whole).
  int64_t num_params_per_rank(int tensor_parallel) const;

  int64_t head_dim() const { return n_embd / n_head; }
  // Matrix-product FLOPs of one forward over one sequence of `seq_len` tokens: per block 24·T·C² + 4·T²·C, and the
  // tied head 2·T·C·V (what dscpp::FlopsCounter counts). Training is 3× this (backward = 2 × forward). An MoE
  // block counts what a token activates: k experts' MLPs (16·T·C² each), the gate (2·T·C·E) and, with the
  // residual, the dense MLP and its coefficient — not the experts it skips.
  int64_t forward_flops(int64_t seq_len) const;
};

}  // namespace gpt
