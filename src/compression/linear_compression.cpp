// DeepSpeed Compression on LibTorch linear layers: Python's LinearLayer_Compress (python/dscpp/compression/
// basic_layer.py) and its schedule, the same arithmetic and the same order of enabling (technique by technique, each
// group's patterns in turn, modules in registration order). Learned scores draw from torch's generator where the
// program's model build left it; Python's layer replacement draws a fresh init for every layer first, so those differ.
// A tensor-parallel slice computes its part of the whole layer's compression (layer_partition.h).
#include "dscpp/compression/linear_compression.h"

#include <algorithm>
#include <cmath>
#include <regex>
#include <set>
#include <stdexcept>

namespace dscpp::compression {
namespace {

// The running range of static activation calibration, a submodule so that its buffer is named as Python's QuantAct's
// (activation_quantizer.x_min_max).
struct QuantActImpl : torch::nn::Module {
  explicit QuantActImpl(const torch::TensorOptions& options) {
    x_min_max = register_buffer("x_min_max", torch::zeros({2}, options));  // on the layer's device and dtype
  }
  torch::Tensor x_min_max;
};

// Drawn whole on each rank of a tensor-parallel layer, then model-parallel rank 0's taken by all (the ranks' generators
// agree when the model was built alike, but a mask must not depend on it).
torch::Tensor learned_scores(torch::IntArrayRef shape, const torch::Tensor& like,
                             const std::optional<LayerPartition>& partition) {
  auto scores = torch::empty(shape, like.options());
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(scores, std::sqrt(5.0));
  if (partition) partition->group->broadcast(scores, 0).wait();
  return scores;
}

// Python's re.search, for the patterns DeepSpeed configs use (ECMAScript's syntax agrees on them); one it cannot
// read (Python-only syntax: named groups, lookbehind, inline flags) is an error naming it.
bool named_by(const std::string& pattern, const std::string& name, const std::string& key) {
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw std::invalid_argument(key + ": the pattern '" + pattern + "' is not a regular expression this program "
                                "reads (ECMAScript syntax; Python-only syntax is not): " + e.what());
  }
  return std::regex_search(name, re);
}

}  // namespace

std::vector<int64_t> LinearCompression::whole_shape() const {
  return partition_ ? partition_->weight.whole_shape : layer_->weight.sizes().vec();
}

void LinearCompression::enable(Technique t, const CompressionConfig& config, const CompressionGroup& group) {
  torch::NoGradGuard no_grad;
  const torch::Tensor& w = layer_->weight;
  // l1 masks are made from the whole layer's weight (assembled once, on a tensor-parallel slice).
  auto whole_weight = [&] { return partition_ ? partition_->whole(w) : w; };
  const std::vector<int64_t> shape = whole_shape();
  const CompressionTechnique& c = technique_config(config, t);
  switch (t) {
    case Technique::kWeightQuantization:
      weight_quantization_ = true;
      in_forward_ = config.quantize_weight_in_forward;
      weight_kind_ = weight_quantizer(group.target_bits, c.quantization_type == "symmetric");
      weight_groups_ = config.quantize_groups;
      moq_bits_ = {group.start_bits, group.target_bits, group.quantization_period};
      if ((shape[0] * shape[1]) % weight_groups_ != 0) {
        throw std::invalid_argument("compression_training.weight_quantization: quantize_groups " +
                                    std::to_string(weight_groups_) + " does not divide " + name_ + "'s " +
                                    std::to_string(shape[0] * shape[1]) + " weights");
      }
      if (partition_ && !in_forward_) {
        throw std::invalid_argument("compression_training.weight_quantization.shared_parameters."
                                    "quantize_weight_in_forward = false (MoQ) with tensor parallelism is not "
                                    "supported yet (" + name_ + " is sliced; MoQ rounds whole weights in place)");
      }
      groups_local_ = !partition_ || partition_->all(partition_->groups_aligned(weight_groups_));
      break;
    case Technique::kSparsePruning:
      sparse_ = true;
      sparse_ratio_ = group.dense_ratio;
      if (c.method == "l1") {
        sparse_mask_ = layer_->register_buffer("sparse_pruning_mask", topk_mask(whole_weight().abs(), sparse_ratio_));
      } else {
        sparse_scores_ = layer_->register_parameter("sparse_mask_scores", learned_scores(shape, w, partition_));
      }
      break;
    case Technique::kRowPruning:
      row_ = true;
      row_ratio_ = group.dense_ratio;
      if (c.method == "l1") {
        const auto norms = at::linalg_vector_norm(whole_weight(), 1, {1}, false, std::nullopt);
        row_mask_ = layer_->register_buffer("row_pruning_mask", topk_mask(norms, row_ratio_).view({-1, 1}));
      } else {
        row_scores_ = layer_->register_parameter("row_mask_scores", learned_scores({shape[0], 1}, w, partition_));
      }
      break;
    case Technique::kHeadPruning:
      head_ = true;
      head_ratio_ = group.dense_ratio;
      num_heads_ = c.num_heads;
      if (shape[1] % num_heads_ != 0) {
        throw std::invalid_argument("compression_training.head_pruning: num_heads " + std::to_string(num_heads_) +
                                    " does not divide " + name_ + "'s " + std::to_string(shape[1]) + " inputs");
      }
      head_scores_ = layer_->register_parameter("head_pruning_scores", learned_scores({1, num_heads_}, w, partition_));
      break;
    case Technique::kActivationQuantization:
      activation_ = true;
      activation_bits_ = group.bits;
      activation_kind_ = c.quantization_type == "symmetric" ? QuantKind::kSymmetric : QuantKind::kAsymmetric;
      if (c.range_calibration == "static") {
        x_min_max_ = layer_->register_module("activation_quantizer", std::make_shared<QuantActImpl>(w.options()))
                         ->x_min_max;
      }
      break;
    case Technique::kChannelPruning:
      throw std::invalid_argument("compression_training.channel_pruning: " + name_ + " is a Linear layer; channel "
                                  "pruning is for Conv2d layers");
  }
}

void LinearCompression::update(const CompressionConfig& config, int64_t applied_steps) {
  weight_on_ = weight_on_ || (weight_quantization_ && technique_on(config, Technique::kWeightQuantization, applied_steps));
  sparse_on_ = sparse_on_ || (sparse_ && technique_on(config, Technique::kSparsePruning, applied_steps));
  row_on_ = row_on_ || (row_ && technique_on(config, Technique::kRowPruning, applied_steps));
  head_on_ = head_on_ || (head_ && technique_on(config, Technique::kHeadPruning, applied_steps));
  activation_on_ =
      activation_on_ || (activation_ && technique_on(config, Technique::kActivationQuantization, applied_steps));
}

torch::Tensor LinearCompression::quantized_weight(const torch::Tensor& w) const {
  if (groups_local_) {  // this rank's groups are whole groups: its slice quantizes on its own
    return fake_quantize(w, weight_kind_, moq_bits_.target, partition_ ? partition_->local_groups(weight_groups_)
                                                                       : weight_groups_);
  }
  // Groups straddle the ranks' slices: the whole weight quantized (as one process does) and this rank's part taken,
  // the gradient straight through to the slice (q + (w − w) is q exactly).
  const torch::Tensor q = partition_->local(quantize(partition_->whole(w), weight_kind_, moq_bits_.target,
                                                     weight_groups_));
  return q + (w - w.detach());
}

torch::Tensor LinearCompression::weight(const torch::Tensor& w) const {
  torch::Tensor out = w;
  if (weight_on_ && in_forward_) out = quantized_weight(out);
  if (sparse_on_) {
    out = out * part(sparse_scores_.defined() ? topk_mask(shared(sparse_scores_), sparse_ratio_) : sparse_mask_);
  }
  if (row_on_) out = out * part(row_scores_.defined() ? topk_mask(shared(row_scores_), row_ratio_) : row_mask_);
  if (head_on_) {  // the input columns of each pruned head zeroed: a head is a run of in/num_heads columns
    const torch::Tensor heads = topk_mask(shared(head_scores_), head_ratio_);
    out = out * part(heads.repeat_interleave(whole_shape()[1] / num_heads_, 1));
  }
  return out;
}

torch::Tensor LinearCompression::bias(const torch::Tensor& b) const {
  if (!row_on_ || !b.defined()) return b;
  // A row-parallel layer's bias is whole and added once after the sum, the same on every rank: its share of the
  // scores' gradient is whole on each rank already, so it is not summed over the group.
  const bool whole_bias = partition_ && partition_->input_split();
  const auto scores = row_scores_.defined() ? (whole_bias ? row_scores_ : shared(row_scores_)) : torch::Tensor();
  return b * part(scores.defined() ? topk_mask(scores, row_ratio_) : row_mask_).view(-1);
}

torch::Tensor LinearCompression::input(const torch::Tensor& x, bool training) const {
  if (!activation_on_) return x;
  // A row-parallel slice's input is split over its features: the ranges are the whole features', over the group.
  const bool split = partition_ && partition_->input_split();
  if (!x_min_max_.defined()) {  // dynamic: one group per token
    const int64_t tokens = x.numel() / x.size(-1);
    if (split) return fake_quantize(x, activation_kind_, activation_bits_, tokens, partition_->input_range(x, true));
    return fake_quantize(x, activation_kind_, activation_bits_, tokens);
  }
  if (training) {  // QuantAct: a running range, momentum 0.95, started at the first batch's
    torch::NoGradGuard no_grad;
    const torch::Tensor whole = split ? partition_->input_range(x, false) : torch::Tensor();
    const torch::Tensor lo = split ? whole[0] : x.min(), hi = split ? whole[1] : x.max();
    torch::Tensor range = x_min_max_;
    if (range[0].item<double>() == range[1].item<double>()) {
      range[0] = lo;
      range[1] = hi;
    }
    const double m = 0.95;
    range[0] = range[0] * m + lo * (1 - m);
    range[1] = range[1] * m + hi * (1 - m);
  }
  return fake_quantize(x, activation_kind_, activation_bits_, 1, x_min_max_);
}

void LinearCompression::moq_quantize(int64_t quantize_step, const CompressionConfig& config, double& real_ratio) {
  torch::NoGradGuard no_grad;
  torch::Tensor w = layer_->weight;
  if (w.dim() < 2 || w.numel() == 0) return;
  if (moq_bits_.advance(quantize_step)) real_ratio = 1.0;
  torch::Tensor q = compression::moq_quantize(w, moq_bits_.bits, config.quantize_groups,
                                              config.weight_quantization.quantization_type == "symmetric",
                                              config.rounding == "stochastic");
  if (config.fp16_mixed_quantize) q = w * real_ratio + q * (1 - real_ratio);
  w.copy_(q);
}

LinearArgs compressed_linear(const std::shared_ptr<LinearCompression>& compression, const torch::Tensor& x,
                             const torch::nn::Linear& layer) {
  if (!compression) return {x, layer->weight, layer->bias};
  return {compression->input(x, layer->is_training()), compression->weight(layer->weight),
          compression->bias(layer->bias)};
}

ModelCompression::ModelCompression(const CompressionConfig& config, torch::nn::Module& model,
                                   std::function<void(const std::string&)> log,
                                   const TensorParallelLayout& tensor_parallel)
    : config_(config), log_(std::move(log)) {
  if (config.layer_reduction.enabled) {
    throw std::invalid_argument("compression_training.layer_reduction: needs the teacher model, which only "
                                "dscpp.compression.init_compression(model, config, teacher_model) (Python) takes");
  }
  const auto modules = model.named_modules();
  std::map<std::string, std::shared_ptr<LinearCompression>> by_name;
  for (Technique t : kTechniques) {
    const CompressionTechnique& c = technique_config(config, t);
    if (!c.enabled) continue;
    std::set<std::string> taken;  // a module belongs to one group of a technique
    for (const CompressionGroup& group : c.groups) {
      for (const std::string& pattern : group.modules) {
        for (const auto& item : modules) {
          const std::string& name = item.key();
          auto* linear = item.value()->as<torch::nn::LinearImpl>();
          const bool compressible = linear != nullptr || item.value()->as<torch::nn::EmbeddingImpl>() != nullptr ||
                                    item.value()->as<torch::nn::Conv2dImpl>() != nullptr;
          if (!compressible ||
              !named_by(pattern, name, "compression_training." + technique_key(t) + ".different_groups." +
                                           group.name + ".modules")) {
            continue;
          }
          if (!taken.insert(name).second) {
            throw std::invalid_argument("compression_training." + technique_key(t) + " group '" + group.name +
                                        "': module '" + name + "' is already in another group of the same technique");
          }
          if (linear == nullptr) {
            throw std::invalid_argument("compression_training." + technique_key(t) + " group '" + group.name +
                                        "' names '" + name + "', which is not a Linear layer: this program compresses "
                                        "linear layers only (dscpp.compression from Python has the others)");
          }
          auto& layer = by_name[name];
          if (!layer) {
            std::optional<LayerPartition> partition;
            const auto slice = tensor_parallel.slices.find(name + ".weight");
            if (slice != tensor_parallel.slices.end()) partition = LayerPartition{tensor_parallel.group, slice->second};
            layer = std::make_shared<LinearCompression>(name, *linear, std::move(partition));
          }
          layer->enable(t, config, group);
          by_layer_[item.value().get()] = layer;
          // A weight shared by two layers (a tied head) is quantized once per step, as DeepSpeed's per-parameter MoQ.
          const bool shared_weight = std::any_of(weight_layers_.begin(), weight_layers_.end(), [&](const auto& other) {
            return other->weight_impl() == linear->weight.unsafeGetTensorImpl();
          });
          if (t == Technique::kWeightQuantization && !shared_weight) weight_layers_.push_back(layer);
        }
      }
    }
  }
  update(0);
}

std::shared_ptr<LinearCompression> ModelCompression::find(const torch::nn::Module* layer) const {
  const auto it = by_layer_.find(layer);
  return it == by_layer_.end() ? nullptr : it->second;
}

void ModelCompression::update(int64_t applied_steps) {
  applied_steps_ = applied_steps;
  for (auto& [layer, compression] : by_layer_) compression->update(config_, applied_steps);
  for (Technique t : kTechniques) {
    if (log_ && technique_on(config_, t, applied_steps) && said_on_.insert(t).second) {
      log_("[deepspeed.cpp] compression: " + technique_key(t) + " on from step " + std::to_string(applied_steps));
    }
  }
}

void ModelCompression::moq_quantize() {
  if (!technique_on(config_, Technique::kWeightQuantization, applied_steps_) || config_.quantize_weight_in_forward) {
    return;
  }
  quantize_steps_ += 1;
  // DeepSpeed's update: down by the ratio while above 0 (so once below it), then 0.
  if (config_.fp16_mixed_quantize) real_ratio_ = real_ratio_ > 0 ? real_ratio_ - config_.quantize_change_ratio : 0.0;
  for (auto& layer : weight_layers_) {
    if (!layer->moq()) continue;
    const int before = layer->moq_bits();
    layer->moq_quantize(quantize_steps_, config_, real_ratio_);
    if (log_ && config_.quantize_verbose && layer->moq_bits() != before) {
      log_("[deepspeed.cpp] compression: MoQ " + std::to_string(layer->moq_bits()) + " bits from quantization " +
           std::to_string(quantize_steps_));
    }
  }
}

void ModelCompression::on_forward() {
  update(applied_steps_);
  moq_quantize();
}

void ModelCompression::on_step(int64_t applied_steps) {
  moq_quantize();
  update(applied_steps);
}

}  // namespace dscpp::compression
