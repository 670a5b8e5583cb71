// Gpt: a decoder with exactly HF GPT-2's architecture and parameter names, so GPT-2 checkpoints load one to one.
//
// Parameter names (named_parameters(), in this order), HF's GPT2Model names without the "transformer." prefix:
//   wte.weight (V, C)   wpe.weight (block_size, C)
//   h.<i>.ln_1.{weight,bias} (C)          h.<i>.attn.c_attn.{weight (3C, C), bias (3C)}
//   h.<i>.attn.c_proj.{weight (C, C), bias (C)}   h.<i>.ln_2.{weight,bias} (C)
//   h.<i>.mlp.c_fc.{weight (4C, C), bias (4C)}     h.<i>.mlp.c_proj.{weight (C, 4C), bias (C)}
//   ln_f.{weight,bias} (C)
// The LM head is tied to wte (logits = ln_f(x)·wteᵀ), so HF's lm_head.weight has no parameter of its own.
// Note for a weight loader: HF stores c_attn/c_proj/c_fc as Conv1D with weight (in, out) — the TRANSPOSE of our
// torch::nn::Linear (out, in) — so those four weights must be transposed on load; embeddings, LayerNorms and all
// biases copy as they are.
//
// Tensor parallel (Megatron's layout, `model_group` of p ranks): each rank holds, under the same names, the rows
// [r·V/p, (r+1)·V/p) of wte (a vocabulary-parallel embedding and head), its nh/p heads of every attention and its
// 4C/p slice of every MLP; LayerNorms, wpe and the row-parallel biases are whole on every rank. The model is drawn
// whole and then sliced, so its values are the same at every p; loss() never forms the whole logits. Dropout draws
// what a single process draws: the residual and embedding dropouts act on activations every model-parallel rank
// holds whole, from generators in the same state, and the attention dropout draws every head's mask and keeps its
// own (causal_attention); so the generators of a model's ranks stay in step and a sliced run drops what one
// process drops (the unfused attention; LibTorch 2.x's fused kernel draws its own way for the whole model).
// The linear layers go through dscpp::column/row_parallel_linear, which call torch::linear: one addmm, so x·Wᵀ + b
// is rounded once in bf16 as PyTorch's F.linear and HF's Conv1D round it (LibTorch 1.13's C++ Linear::forward
// rounds twice on inputs of more than two dimensions).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dscpp/checkpoint/tensor_slice.h"
#include "dscpp/comm/comm.h"
#include "dscpp/compression/linear_compression.h"
#include "dscpp/config/sparse_attention.h"
#include "model/block.h"
#include "model/gpt_config.h"
#include "model/kv_cache.h"

namespace gpt {

class GptImpl : public torch::nn::Module {
 public:
  // Called with each block as soon as it is built and initialised, before the next one exists. ZeRO-3's
  // partitioned construction (dscpp::PartitionedInit::partition, DeepSpeed's zero.Init) keeps this rank's shard of
  // the block and frees the rest, so no rank ever holds the whole model. The block must not be touched after.
  using BlockBuilt = std::function<void(std::shared_ptr<torch::nn::Module> block)>;

  // Validates the config; initializes as GPT-2 does (deterministic given torch::manual_seed):
  // Linear/Embedding weights ~ N(0, 0.02), residual output projections (c_proj) ~ N(0, 0.02/√(2·n_layer)),
  // biases 0, LayerNorm weight 1 / bias 0. Dropout as config.dropout says. Each module is initialised right after it is built, in
  // registration order, so the values are the same whether or not `block_built` is given.
  // `model_group`: the tensor-parallel group (null: the whole model on this rank). std::invalid_argument naming the
  // numbers when heads, 4·n_embd or vocab_size do not divide over it.
  // `moe`: how MoE blocks (config.moe_experts > 0) route and spread their experts. Each expert starts as a copy of
  // one freshly initialised MLP (DeepSpeed deep-copies the expert it is given), drawn once per MoE block, so the
  // values are the same at every ep_size. MoE with tensor parallelism: std::invalid_argument.
  explicit GptImpl(GptConfig config, const BlockBuilt& block_built = {},
                   std::shared_ptr<dscpp::Comm> model_group = nullptr, MoeSettings moe = {});

  // idx: (B, T) int64 token ids, T ≤ block_size → logits (B, T, V) in the parameters' dtype (tensor parallel: gathered
  // from the ranks).
  torch::Tensor forward(const torch::Tensor& idx);

  // Mean cross-entropy of next-token prediction over all B·T positions; computed in fp32 whatever the
  // parameters' dtype. targets: (B, T) int64. With MoE blocks, plus moe_loss_coeff × their aux losses
  // (moe_aux_loss()).
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  // MoeSettings::loss_coeff × the sum of the MoE blocks' load-balancing losses from the last forward (0 when dense).
  torch::Tensor moe_aux_loss() const;
  // Seconds the MoE blocks have spent exchanging tokens (all-to-all, forward and backward) on this rank.
  double moe_all_to_all_seconds() const;
  // The same from head()'s output (this rank's columns of the logits): what a pipeline's last stage computes.
  torch::Tensor loss_of_logits(const torch::Tensor& local_logits, const torch::Tensor& targets);

  // Generation (model/generation.h): the logits (B, V) of the last of `idx`'s positions, which come after the
  // `cache`'s (empty: the first forward, over the prompts), whose keys and values the blocks append to it. `valid`
  // (B, T) bool marks idx's tokens (false: left padding, which no query attends to and which positions skip, as
  // HF's position_ids from an attention mask do). The blocks run through the block runner, as forward()'s do; the
  // model should be in eval mode. std::invalid_argument for bad shapes, more than block_size positions in all,
  // sequence parallelism or sparse attention.
  torch::Tensor forward_cached(const torch::Tensor& idx, const torch::Tensor& valid, KvCache& cache);

  // forward() = head(h[L-1](… h[0](embed(idx)))). Exposed so a wrapper (ZeRO-3) can run the blocks itself,
  // gathering each block's parameters just before its call.
  torch::Tensor embed(const torch::Tensor& idx);  // (B, T) → token + position embeddings (B, T, C)
  torch::Tensor head(const torch::Tensor& x);     // (B, T, C) → ln_f → tied LM head → (B, T, V/p): this rank's columns
  torch::Tensor hidden(const torch::Tensor& idx);  // embed, then every block through the block runner: (B, T, C)
  // Token + position embeddings at `positions` ((T) or (B, T) int64), with embed()'s checks and dropout.
  torch::Tensor embed_at(const torch::Tensor& idx, const torch::Tensor& positions);
  const std::vector<Block>& blocks() const { return blocks_; }

  // How forward() calls each block: `run(block, x)` must return block->forward(x). The default calls it directly;
  // the trainer routes it through Engine::run_unit (ZeRO-3 gathers the block's parameters around it) and, with
  // activation checkpointing, Engine::checkpoint.
  using BlockRunner = std::function<torch::Tensor(const Block& block, const torch::Tensor& x)>;
  void set_block_runner(BlockRunner runner) { block_runner_ = std::move(runner); }

  // DeepSpeed-Ulysses over `group` (P consecutive ranks that share their samples): idx and targets are then this
  // rank's T/P positions of each sequence (rank r's start at r·T/P), every attention runs between all-to-alls
  // (CausalSelfAttention::set_sequence_group), and loss() is this rank's share of the sequences' mean loss — its
  // positions' mean / P, which the ranks' gradients add up to (DeepSpeed sums them over the sequence ranks) — with the
  // value of the whole mean (the shares summed over the group), so a log shows what one process shows.
  // std::invalid_argument for MoE blocks or tensor parallelism with it.
  void set_sequence_group(std::shared_ptr<dscpp::Comm> group);

  // DeepSpeed Compression of the blocks' linear layers as `compression` (built over this model) has them: each
  // attention's and dense MLP's layers compute through their LinearCompression from here on (sliced layers as their
  // whole layers: `compression` built with this model's model_group() and tensor_parallel_slices()).
  // std::invalid_argument with MoE blocks — not supported yet.
  void attach_compression(const dscpp::compression::ModelCompression& compression);

  // DeepSpeed's sparse_attention: each block's attention computes only its layout's blocks. The layouts are made
  // for block_size positions, block by block in order, their random blocks drawn from Python's `random` seeded with
  // `seed` (a DeepSpeed script that called random.seed(seed) draws the same); each rank keeps its heads' rows.
  // std::invalid_argument with dropout (DeepSpeed's sparse attention has none) or sequence parallelism, or a layout
  // that does not fit block_size.
  void set_sparse_attention(dscpp::SparsityConfig config, uint64_t seed);

  // loss() through dscpp::tiled_cross_entropy, `positions` at a time (0: the whole logits at once): the (B·T, V)
  // logits never exist whole. std::invalid_argument with tensor parallelism, whose logits are split over the
  // vocabulary already (vocab_parallel_cross_entropy).
  void set_tiled_loss(int64_t positions);

  const GptConfig& config() const { return config_; }
  const std::shared_ptr<dscpp::Comm>& model_group() const { return group_; }
  // The trainable parameters that are slices over model_group, by name, and where each sits in the whole parameter
  // (the engine's InitOptions::model_parallel_slices); empty when the model is whole.
  std::map<std::string, dscpp::TensorSlice> tensor_parallel_slices() const;

  torch::nn::Embedding wte{nullptr};  // (V, C), also the LM head
  torch::nn::Embedding wpe{nullptr};  // (block_size, C)
  torch::nn::ModuleList h{nullptr};   // the n_layer Blocks, registered as "h" (names h.0 …)
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  GptConfig config_;
  std::shared_ptr<dscpp::Comm> group_;  // tensor-parallel group (a single-process comm: whole)
  std::shared_ptr<dscpp::Comm> sequence_group_;  // DeepSpeed-Ulysses (null: off)
  int64_t tiled_loss_ = 0;                       // positions per tile of the loss (0: untiled)
  MoeSettings moe_;
  std::vector<Block> blocks_;  // the same modules as h, typed
  BlockRunner block_runner_;
};
TORCH_MODULE(Gpt);

}  // namespace gpt
