// Gpt: embeddings → blocks → ln_f → tied head, plus GPT-2's weight initialization.
#include "model/gpt.h"

#include "dscpp/parallel/tensor_parallel_layers.h"
#include "dscpp/parallel/tensor_parallel_ops.h"
#include "dscpp/sequence/tiled_loss.h"
#include "model/dropout.h"
#include "dscpp/sparse_attention/python_random.h"
#include "dscpp/sparse_attention/sparsity_config.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace gpt {
namespace {

constexpr double kInitStd = 0.02;  // GPT-2's initializer_range

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_of(const torch::Tensor& t) {
  std::string s = "(";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + ")";
}

// GPT-2's initialisation of `module` and everything under it. The residual-stream outputs (c_proj) are scaled
// down so the sum over 2·n_layer residual additions keeps unit scale.
void init_gpt2(torch::nn::Module& module, int64_t n_layer) {
  torch::NoGradGuard no_grad;
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(n_layer));
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    // MoE experts are copies of one MLP initialised once (init_experts): drawing each would tie the values to how
    // many experts this rank holds.
    if (item.key().find("deepspeed_experts") != std::string::npos) continue;
    if (auto* linear = item.value()->as<torch::nn::Linear>()) {
      linear->weight.normal_(0.0, ends_with(item.key(), "c_proj") ? residual_std : kInitStd);
      if (linear->bias.defined()) linear->bias.zero_();  // an MoE gate has none
    } else if (auto* embedding = item.value()->as<torch::nn::Embedding>()) {
      embedding->weight.normal_(0.0, kInitStd);
    } else if (auto* norm = item.value()->as<torch::nn::LayerNorm>()) {
      norm->weight.fill_(1.0);
      norm->bias.zero_();
    }
  }
}

// An MoE block's experts (and, with the residual, its dense MLP): copies of one MLP initialised as GPT-2's is —
// DeepSpeed deep-copies the expert module it is given.
void init_experts(dscpp::moe::MoEImpl& layer, const GptConfig& config) {
  Mlp fresh(config);
  init_gpt2(*fresh, config.n_layer);
  const auto values = fresh->parameters();
  torch::NoGradGuard no_grad;
  auto copy_into = [&](torch::nn::Module& module) {
    const auto params = module.parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(values.at(i));
  };
  for (auto& expert : layer.experts) copy_into(*expert.ptr());
  if (!layer.mlp.is_empty()) copy_into(*layer.mlp.ptr());
}

// Tensor parallelism slices what it must divide: the heads, the MLP's width and the vocabulary.
void check_divides(const GptConfig& c, int p) {
  if (p == 1) return;
  auto require = [p](int64_t n, const std::string& what, const std::string& flag) {
    if (n % p != 0) {
      throw std::invalid_argument("gpt: " + what + " " + std::to_string(n) +
                                  " does not divide over the tensor-parallel size " + std::to_string(p) + " (" + flag +
                                  ")");
    }
  };
  require(c.n_head, "n_head", "each rank computes n_head/p heads; --n_head");
  require(4 * c.n_embd, "the MLP width 4·n_embd", "--n_embd");
  require(c.vocab_size, "vocab_size",
          "each rank holds vocab_size/p rows of the tied embedding; pad the vocabulary to a multiple of p");
}

}  // namespace

GptImpl::GptImpl(GptConfig config, const BlockBuilt& block_built, std::shared_ptr<dscpp::Comm> model_group,
                 MoeSettings moe)
    : config_(std::move(config)),
      group_(model_group ? std::move(model_group) : dscpp::make_single_process_comm()),
      moe_(std::move(moe)) {
  config_.validate();
  check_divides(config_, group_->world_size());
  if (config_.moe_experts > 0 && group_->world_size() > 1) {
    throw std::invalid_argument("gpt: --moe_experts with tensor parallelism (" + std::to_string(group_->world_size()) +
                                " ranks per model) is not supported yet");
  }
  const int p = group_->world_size(), r = group_->rank();
  // Registration order is HF's order, which is the order named_parameters() lists. Each module draws its values
  // from the global generator right after it is built, so a partitioned build (which frees each block before the
  // next exists) consumes the generator exactly as a whole build does.
  wte = register_module("wte", torch::nn::Embedding(config_.vocab_size, config_.n_embd));
  init_gpt2(*wte, config_.n_layer);
  if (p > 1) {
    torch::NoGradGuard no_grad;
    wte->weight.set_data(wte->weight.chunk(p, 0)[r].clone());
  }
  wpe = register_module("wpe", torch::nn::Embedding(config_.block_size, config_.n_embd));
  init_gpt2(*wpe, config_.n_layer);
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    blocks_.push_back(Block(config_, group_, config_.is_moe_block(i) ? &moe_ : nullptr));
    h->push_back(blocks_.back());
    init_gpt2(*blocks_.back(), config_.n_layer);
    blocks_.back()->attn->keep_own_heads();
    if (blocks_.back()->moe) {
      init_experts(*blocks_.back()->moe, config_);
    } else {
      blocks_.back()->mlp->keep_own_slices();
    }
    if (block_built) block_built(blocks_.back().ptr());
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(
                                     torch::nn::LayerNormOptions({config_.n_embd}).eps(config_.layer_norm_eps)));
  init_gpt2(*ln_f, config_.n_layer);
}

torch::Tensor GptImpl::embed(const torch::Tensor& idx) {
  if (idx.dim() != 2 || idx.scalar_type() != torch::kLong) {
    throw std::invalid_argument("Gpt::forward: idx must be a (B, T) int64 tensor, got shape " + shape_of(idx) +
                                " of " + std::string(c10::toString(idx.scalar_type())));
  }
  const int64_t T = idx.size(1);
  if (T > config_.block_size) {
    throw std::invalid_argument("Gpt::forward: sequence length " + std::to_string(T) + " exceeds block_size " +
                                std::to_string(config_.block_size) + "; lower --seq_len");
  }
  // (T), broadcast over the batch; with sequence parallelism this rank's positions of the whole sequence.
  const int64_t first = sequence_group_ ? sequence_group_->rank() * T : 0;
  if (first + T > config_.block_size) {
    throw std::invalid_argument("Gpt::forward: the sequence of " + std::to_string(T) + " positions per rank × " +
                                std::to_string(sequence_group_->world_size()) + " sequence-parallel ranks exceeds " +
                                "block_size " + std::to_string(config_.block_size) + "; lower --seq_len");
  }
  return embed_at(idx, torch::arange(first, first + T, idx.options()));
}

torch::Tensor GptImpl::embed_at(const torch::Tensor& idx, const torch::Tensor& positions) {
  const int64_t vocab_begin = group_->rank() * wte->weight.size(0);
  auto x = dscpp::vocab_parallel_embedding(idx, wte->weight, vocab_begin, group_) + wpe->forward(positions);
  return config_.dropout > 0 && is_training() ? dropout(x, config_.dropout, sequence_group_) : x;
}

torch::Tensor GptImpl::forward_cached(const torch::Tensor& idx, const torch::Tensor& valid, KvCache& cache) {
  if (idx.dim() != 2 || idx.scalar_type() != torch::kLong || idx.size(1) == 0) {
    throw std::invalid_argument("Gpt::forward_cached: idx must be a (B, T) int64 tensor with T >= 1, got shape " +
                                shape_of(idx) + " of " + std::string(c10::toString(idx.scalar_type())));
  }
  if (valid.sizes() != idx.sizes() || valid.scalar_type() != torch::kBool) {
    throw std::invalid_argument("Gpt::forward_cached: valid must be a bool tensor of idx's shape " + shape_of(idx) +
                                ", got " + shape_of(valid));
  }
  if (sequence_group_) {
    throw std::invalid_argument("Gpt::forward_cached: generation with sequence parallelism is not supported yet");
  }
  const int64_t past = cache.length(), T = idx.size(1), total = past + T;
  if (past > 0 && cache.valid.size(0) != idx.size(0)) {
    throw std::invalid_argument("Gpt::forward_cached: idx has " + std::to_string(idx.size(0)) +
                                " rows, the cache " + std::to_string(cache.valid.size(0)));
  }
  if (total > config_.block_size) {
    throw std::invalid_argument("Gpt::forward_cached: " + std::to_string(total) + " positions exceed block_size " +
                                std::to_string(config_.block_size));
  }
  if (cache.layers.empty()) cache.layers.resize(blocks_.size());
  const auto all_valid = past > 0 ? torch::cat({cache.valid, valid.to(cache.valid.device())}, 1) : valid;
  // A row's positions count its tokens only, so a left-padded prompt is positioned as it would be alone.
  const auto positions = (all_valid.to(torch::kLong).cumsum(1) - 1).clamp_min(0).narrow(1, past, T);
  // Query past+i attends to the tokens at or before it; a padding query to itself alone (its output is never read,
  // and a row of the softmax with nothing in it would be NaN).
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(idx.device());
  const auto query = torch::arange(past, total, opts).view({T, 1}), key = torch::arange(total, opts).view({1, total});
  const auto allowed = ((key <= query).unsqueeze(0) & all_valid.unsqueeze(1)) | (key == query).unsqueeze(0);
  cache.valid = all_valid;
  struct Attach {  // the blocks' attentions use the cache for this forward only, even when it throws
    std::vector<Block>& blocks;
    ~Attach() {
      for (auto& block : blocks) block->attn->set_cache(nullptr);
    }
  } attach{blocks_};
  for (size_t i = 0; i < blocks_.size(); ++i) {
    cache.layers[i].allowed = allowed.unsqueeze(1);
    blocks_[i]->attn->set_cache(&cache.layers[i]);
  }
  auto x = embed_at(idx, positions);
  for (auto& block : blocks_) x = block_runner_ ? block_runner_(block, x) : block->forward(x);
  return dscpp::gather_from_model_parallel(head(x.narrow(1, T - 1, 1)), group_).squeeze(1);
}

torch::Tensor GptImpl::head(const torch::Tensor& x) {
  return dscpp::column_parallel_linear(ln_f->forward(x), wte->weight, torch::Tensor(), group_);  // no bias
}

torch::Tensor GptImpl::hidden(const torch::Tensor& idx) {
  auto x = embed(idx);
  for (auto& block : blocks_) x = block_runner_ ? block_runner_(block, x) : block->forward(x);
  return x;
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx) {
  return dscpp::gather_from_model_parallel(head(hidden(idx)), group_);
}

std::map<std::string, dscpp::TensorSlice> GptImpl::tensor_parallel_slices() const {
  const int p = group_->world_size(), r = group_->rank();
  if (p == 1) return {};
  using dscpp::TensorSlice;
  const int64_t V = config_.vocab_size, C = config_.n_embd;
  std::map<std::string, TensorSlice> out{{"wte.weight", TensorSlice::part({V, C}, 0, p, r)}};
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const std::string block = "h." + std::to_string(i) + ".";
    // c_attn's rows are [q; k; v]: this rank's heads are a part of each of the three blocks.
    out.emplace(block + "attn.c_attn.weight", TensorSlice::part({3 * C, C}, 0, p, r, 3));
    out.emplace(block + "attn.c_attn.bias", TensorSlice::part({3 * C}, 0, p, r, 3));
    out.emplace(block + "attn.c_proj.weight", TensorSlice::part({C, C}, 1, p, r));
    out.emplace(block + "mlp.c_fc.weight", TensorSlice::part({4 * C, C}, 0, p, r));
    out.emplace(block + "mlp.c_fc.bias", TensorSlice::part({4 * C}, 0, p, r));
    out.emplace(block + "mlp.c_proj.weight", TensorSlice::part({C, 4 * C}, 1, p, r));
  }
  return out;
}

torch::Tensor GptImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  if (targets.sizes() != idx.sizes()) {
    throw std::invalid_argument("Gpt::loss: targets shape " + shape_of(targets) + " must equal idx shape " +
                                shape_of(idx));
  }
  torch::Tensor loss;
  if (tiled_loss_ > 0) {
    const int64_t vocab = config_.data_vocab_size > 0 ? config_.data_vocab_size : config_.vocab_size;
    const auto x = ln_f->forward(hidden(idx));
    loss = dscpp::tiled_cross_entropy(x.reshape({-1, x.size(-1)}), wte->weight, targets.reshape({-1}), tiled_loss_,
                                      vocab);
  } else {
    loss = loss_of_logits(head(hidden(idx)), targets);
  }
  if (sequence_group_) {
    // This rank's share, valued at the whole: value share + (sum − share) = sum, gradient the share's alone.
    const auto share = loss / sequence_group_->world_size();
    auto sum = share.detach().clone();
    sequence_group_->all_reduce(sum, dscpp::ReduceOp::kSum).wait();
    return share + (sum - share.detach());
  }
  // After the forward (not an operand of the same +, whose order C++ leaves open): the aux losses it just made.
  return config_.moe_experts > 0 ? loss + moe_aux_loss() : loss;
}

void GptImpl::set_sequence_group(std::shared_ptr<dscpp::Comm> group) {
  if (!group || group->world_size() == 1) return;
  if (config_.moe_experts > 0 || group_->world_size() > 1) {
    throw std::invalid_argument("Gpt: sequence parallelism with " +
                                std::string(config_.moe_experts > 0 ? "MoE blocks" : "tensor parallelism") +
                                " is not supported yet");
  }
  sequence_group_ = std::move(group);
  for (auto& block : blocks_) {
    block->attn->set_sequence_group(sequence_group_);
    if (!block->mlp.is_empty()) block->mlp->set_sequence_group(sequence_group_);
  }
}

void GptImpl::attach_compression(const dscpp::compression::ModelCompression& compression) {
  if (config_.moe_experts > 0) {
    throw std::invalid_argument("compression_training with MoE blocks is not supported yet by gpt-train");
  }
  for (auto& block : blocks_) {
    block->attn->c_attn_compression = compression.find(block->attn->c_attn.get());
    block->attn->c_proj_compression = compression.find(block->attn->c_proj.get());
    block->mlp->c_fc_compression = compression.find(block->mlp->c_fc.get());
    block->mlp->c_proj_compression = compression.find(block->mlp->c_proj.get());
  }
}

void GptImpl::set_sparse_attention(dscpp::SparsityConfig config, uint64_t seed) {
  if (config_.dropout > 0 || sequence_group_) {
    throw std::invalid_argument(std::string("sparse_attention with ") +
                                (sequence_group_ ? "sequence parallelism" : "--dropout (DeepSpeed's sparse attention "
                                                                            "has no attention dropout)") +
                                " is not supported yet by gpt-train");
  }
  config.num_heads = config_.n_head;
  dscpp::sparse_attention::PythonRandom random(seed);
  const auto sample = [&random](int64_t n, int64_t k) { return random.sample(n, k); };
  const int p = group_->world_size(), r = group_->rank();
  for (auto& block : blocks_) {
    torch::Tensor layout;
    try {
      layout = dscpp::sparse_attention::make_layout(config, config_.block_size, sample);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string(e.what()) + " (gpt-train makes each layout for block_size " +
                                  std::to_string(config_.block_size) + " positions)");
    }
    block->attn->set_sparse_layout(layout.chunk(p, 0)[r].contiguous(), config.block);
  }
}

void GptImpl::set_tiled_loss(int64_t positions) {
  if (positions > 0 && group_->world_size() > 1) {
    throw std::invalid_argument("--tiled_loss with tensor parallelism: the logits are split over the vocabulary "
                                "there already; use one or the other");
  }
  tiled_loss_ = positions;
}

double GptImpl::moe_all_to_all_seconds() const {
  double seconds = 0;
  for (const auto& block : blocks_) seconds += block->moe ? block->moe->all_to_all_seconds() : 0.0;
  return seconds;
}

torch::Tensor GptImpl::moe_aux_loss() const {
  torch::Tensor total;
  for (const auto& block : blocks_) {
    if (block->l_aux.defined()) total = total.defined() ? total + block->l_aux : block->l_aux;
  }
  return total.defined() ? total * moe_.loss_coeff : torch::zeros({}, torch::kFloat);
}

torch::Tensor GptImpl::loss_of_logits(const torch::Tensor& local_logits, const torch::Tensor& targets) {
  const int64_t vocab = config_.data_vocab_size > 0 ? config_.data_vocab_size : config_.vocab_size;
  if (group_->world_size() > 1) {  // this rank's columns of the logits only
    return dscpp::vocab_parallel_cross_entropy(local_logits.reshape({-1, local_logits.size(-1)}),
                                               targets.reshape({-1}), group_, vocab);
  }
  auto logits = local_logits;
  if (vocab != config_.vocab_size) logits = logits.narrow(-1, 0, vocab);  // padding rows: no probability (llm.c)
  // fp32 log-softmax: bf16/fp16 logits lose too much precision over a 50k vocabulary.
  return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}).to(torch::kFloat), targets.reshape({-1}));
}

}  // namespace gpt
