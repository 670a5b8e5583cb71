// ModelTensors: a model as the engine trains it — its named parameters, its buffers and ZeRO-3's gather units, as
// the model's own tensors. The engine needs nothing else of a model, so a LibTorch module and a Python nn.Module
// (whose parameters are the same at::Tensors) reach the one engine the same way.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dscpp/zero/gather_unit.h"
#include "dscpp/zero/partition_unit.h"

namespace dscpp {

struct NamedTensor {
  std::string name;     // dotted, as the module names it ("blocks.0.attn.qkv.weight")
  torch::Tensor tensor; // the model's own tensor: the engine re-points its data (casts, flat views, shards)
};

struct ModelTensors {
  // Every parameter, trainable or frozen, once each (a tied parameter under its first name), in registration order.
  // The trainable ones (requires_grad) are what ZeRO partitions and the optimizer updates; frozen ones are treated
  // as buffers.
  std::vector<NamedTensor> params;
  std::vector<NamedTensor> buffers;  // running statistics, masks: rank 0's values on every rank, never trained
  // Names of buffers that checkpoints leave out, as a module's state_dict does (Python's register_buffer(...,
  // persistent=False): a causal mask, rotary tables, rebuilt by the module itself). Each must name one of `buffers`.
  std::set<std::string> non_persistent_buffers;
  std::vector<GatherUnit> units;     // ZeRO-3's units, in the order given (ignored by stages 0-2)
  // Units built partitioned (zero.Init), in any order: ZeRO-3 adopts their shards (needs stage 3).
  std::vector<PrepartitionedUnit> prepartitioned;
};

// The tensors of a LibTorch module. Each of `units` must be a submodule of `model` (or the model itself):
// std::invalid_argument naming its index otherwise. LibTorch's named_parameters(), unlike Python's, lists a tied
// parameter under each of its names; it is taken once here.
ModelTensors model_tensors(torch::nn::Module& model, const std::vector<std::shared_ptr<torch::nn::Module>>& units);

// Casts every floating-point parameter and buffer to `dtype` in place (set_data, as nn.Module.to does), so the
// model's own tensor objects — a Python module's too — now hold the cast values. Integer and bool tensors stay.
void cast_floating(ModelTensors& model, torch::ScalarType dtype);

}  // namespace dscpp
