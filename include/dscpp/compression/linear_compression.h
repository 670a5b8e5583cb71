// DeepSpeed Compression on a LibTorch model's linear layers (gpt-train's --compression): what Python's
// LinearLayer_Compress does in its forward — fake-quantized weight, sparse / row / head masks, quantized input — as
// functions a model's forward applies to (input, weight, bias) before its own linear. The masks and learned scores are
// registered on the layer under Python's names (sparse_pruning_mask, row_mask_scores, head_pruning_scores,
// activation_quantizer.x_min_max), so checkpoints move between the two front ends and Python's redundancy_clean can
// finish a model gpt-train trained.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/checkpoint/tensor_slice.h"
#include "dscpp/comm/comm.h"
#include "dscpp/compression/layer_partition.h"
#include "dscpp/compression/quantize.h"
#include "dscpp/compression/schedule.h"
#include "dscpp/config/compression.h"

namespace dscpp::compression {

class LinearCompression {
 public:
  // `partition`: the layer is a tensor-parallel slice that computes as its whole layer (layer_partition.h).
  LinearCompression(std::string name, torch::nn::LinearImpl& layer, std::optional<LayerPartition> partition = {})
      : layer_(&layer), name_(std::move(name)), partition_(std::move(partition)) {}

  // Enables technique `t` with its group's parameters: masks are made now (l1: from the layer's current weight) and
  // learned scores drawn (kaiming-uniform, from torch's generator), each registered on the layer — whole-layer
  // shaped, also on a tensor-parallel slice.
  void enable(Technique t, const CompressionConfig& config, const CompressionGroup& group);

  // The switches after `applied_steps` (a technique, once on, stays on).
  void update(const CompressionConfig& config, int64_t applied_steps);

  // What the forward uses: the weight fake-quantized and masked, the bias row-masked, the input quantized (static
  // calibration moves its running range while `training`).
  torch::Tensor weight(const torch::Tensor& w) const;
  torch::Tensor bias(const torch::Tensor& b) const;
  torch::Tensor input(const torch::Tensor& x, bool training) const;

  // MoQ (quantize_weight_in_forward false): the layer's weight put in place on its bits at quantize call
  // `quantize_step` (dropping one when due, which restarts fp16_mixed_quantize's `real_ratio` at 1).
  void moq_quantize(int64_t quantize_step, const CompressionConfig& config, double& real_ratio);
  bool moq() const { return weight_quantization_ && !in_forward_; }
  int moq_bits() const { return moq_bits_.bits; }
  const c10::TensorImpl* weight_impl() const { return layer_->weight.unsafeGetTensorImpl(); }

 private:
  std::vector<int64_t> whole_shape() const;
  // A whole-layer mask or scores as this rank computes with them (the identity without a partition).
  torch::Tensor part(const torch::Tensor& t) const { return partition_ ? partition_->local(t) : t; }
  torch::Tensor shared(const torch::Tensor& scores) const { return partition_ ? partition_->shared(scores) : scores; }
  torch::Tensor quantized_weight(const torch::Tensor& w) const;

  torch::nn::LinearImpl* layer_ = nullptr;
  std::string name_;
  std::optional<LayerPartition> partition_;
  // Which techniques the layer has, and which are on now.
  bool weight_quantization_ = false, sparse_ = false, row_ = false, head_ = false, activation_ = false;
  bool weight_on_ = false, sparse_on_ = false, row_on_ = false, head_on_ = false, activation_on_ = false;
  // weight quantization
  bool in_forward_ = false;
  QuantKind weight_kind_ = QuantKind::kSymmetric;
  int64_t weight_groups_ = 1;  // the whole layer's
  bool groups_local_ = true;    // each group within this rank's slice (always, unpartitioned)
  MoqBits moq_bits_;
  // pruning: an l1 mask (buffer) or learned scores (parameter), and the kept ratio
  torch::Tensor sparse_mask_, sparse_scores_, row_mask_, row_scores_, head_scores_;
  double sparse_ratio_ = 1, row_ratio_ = 1, head_ratio_ = 1;
  int64_t num_heads_ = 1;
  // activation quantization
  int activation_bits_ = 8;
  QuantKind activation_kind_ = QuantKind::kSymmetric;
  torch::Tensor x_min_max_;  // static calibration's running range (undefined: dynamic, one group per token)
};

// What a compressed linear layer computes with: (input, weight, bias) through `compression`, or as they are when it
// is null. A model's forward calls its linear (or tensor-parallel linear) on these.
struct LinearArgs {
  torch::Tensor input, weight, bias;
};
LinearArgs compressed_linear(const std::shared_ptr<LinearCompression>& compression, const torch::Tensor& x,
                             const torch::nn::Linear& layer);

// A model whose linear layers are tensor-parallel slices: the model-parallel group, and each sliced parameter's place
// in its whole by name (as named_parameters() names it; GptImpl::tensor_parallel_slices() gives them).
struct TensorParallelLayout {
  std::shared_ptr<Comm> group;
  std::map<std::string, TensorSlice> slices;
};

// Every linear layer of `model` the config names, with the schedule: gpt-train's counterpart of Python's
// init_compression + compression_scheduler (techniques that need other layers — layer reduction, channel pruning —
// and groups naming a layer that is not a Linear are refused, std::invalid_argument naming it).
class ModelCompression {
 public:
  // `log`: where techniques switching on (and, with quantize_verbose, MoQ's bit drops) are said; empty: nowhere.
  // `tensor_parallel`: the layers it slices compress as their whole layers (a collective set-up: every rank of the
  // group builds its ModelCompression at the same point).
  ModelCompression(const CompressionConfig& config, torch::nn::Module& model,
                   std::function<void(const std::string&)> log = {}, const TensorParallelLayout& tensor_parallel = {});

  // The layer's compression, or nullptr.
  std::shared_ptr<LinearCompression> find(const torch::nn::Module* layer) const;
  // Before a forward while no step has been applied (DeepSpeed's "step zero" check, each such forward).
  void on_forward();
  // After an applied optimizer step: MoQ quantizes the new weights, then the schedule moves to `applied_steps`.
  void on_step(int64_t applied_steps);
  // After a checkpoint's load: the techniques on that the loaded run had on (MoQ's bits start again, as DeepSpeed's).
  void resume(int64_t applied_steps) { update(applied_steps); }
  // Whether weight quantization is MoQ (the weights quantized in place after each step).
  bool moq() const { return config_.weight_quantization.enabled && !config_.quantize_weight_in_forward; }
  size_t layers() const { return by_layer_.size(); }

 private:
  void update(int64_t applied_steps);
  void moq_quantize();

  CompressionConfig config_;
  std::function<void(const std::string&)> log_;
  std::map<const torch::nn::Module*, std::shared_ptr<LinearCompression>> by_layer_;
  // MoQ's layers in the order weight quantization was enabled on them (its stochastic rounding draws in that order).
  std::vector<std::shared_ptr<LinearCompression>> weight_layers_;
  int64_t applied_steps_ = 0;
  std::set<Technique> said_on_;  // the techniques whose switching on was logged
  int64_t quantize_steps_ = 0;
  double real_ratio_ = 1.0;  // fp16_mixed_quantize's share of the real weight
};

}  // namespace dscpp::compression
