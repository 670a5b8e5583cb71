// ModelTensors from a LibTorch module, and the in-place cast every front end shares.
#include "dscpp/engine/model_tensors.h"

#include <map>
#include <stdexcept>
#include <unordered_set>

namespace dscpp {
namespace {

// Adds each tensor not seen yet (by TensorImpl: the same tensor under two names is one tensor).
void add_unique(const torch::OrderedDict<std::string, torch::Tensor>& items, std::vector<NamedTensor>& out,
                std::unordered_set<const c10::TensorImpl*>& seen) {
  for (const auto& item : items) {
    if (!item.value().defined() || !seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    out.push_back({item.key(), item.value()});
  }
}

}  // namespace

ModelTensors model_tensors(torch::nn::Module& model, const std::vector<std::shared_ptr<torch::nn::Module>>& units) {
  ModelTensors out;
  std::unordered_set<const c10::TensorImpl*> seen;
  add_unique(model.named_parameters(/*recurse=*/true), out.params, seen);
  add_unique(model.named_buffers(/*recurse=*/true), out.buffers, seen);

  std::map<const torch::nn::Module*, std::string> name_of;
  for (const auto& item : model.named_modules()) name_of.emplace(item.value().get(), item.key());
  for (size_t i = 0; i < units.size(); ++i) {
    auto it = units[i] ? name_of.find(units[i].get()) : name_of.end();
    if (it == name_of.end()) {
      throw std::invalid_argument("InitOptions::gather_units[" + std::to_string(i) +
                                  "] is not a submodule of the model passed to dscpp::initialize");
    }
    GatherUnit unit{it->second.empty() ? "(the model itself)" : it->second, {}};
    for (const auto& p : units[i]->parameters(/*recurse=*/true)) unit.params.push_back(p);
    out.units.push_back(std::move(unit));
  }
  return out;
}

void cast_floating(ModelTensors& model, torch::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  auto cast = [dtype](std::vector<NamedTensor>& tensors) {
    for (auto& t : tensors) {
      // A parameter of a model built partitioned holds no memory; it is already in the dtype (checked by the
      // engine), and reading it would fault.
      if (!t.tensor.is_floating_point() || t.tensor.scalar_type() == dtype) continue;
      t.tensor.set_data(t.tensor.to(dtype));
    }
  };
  cast(model.params);
  cast(model.buffers);
}

}  // namespace dscpp
