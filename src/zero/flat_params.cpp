// FlatParams: moving parameters into flat storage and keeping their gradients attached to it.
#include "dscpp/zero/flat_params.h"

#include <stdexcept>

namespace dscpp {
namespace {

std::vector<FlatLayout::Param> describe(const std::vector<torch::Tensor>& params, const std::vector<std::string>& names,
                                        const std::vector<bool>& expert) {
  if (params.size() != names.size()) throw std::invalid_argument("FlatParams: params and names differ in length");
  if (!expert.empty() && expert.size() != params.size()) {
    throw std::invalid_argument("FlatParams: the expert flags and the params differ in length");
  }
  std::vector<FlatLayout::Param> out;
  out.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    out.push_back({names[i], params[i].sizes().vec(), /*starts_group=*/false, !expert.empty() && expert[i]});
  }
  return out;
}

}  // namespace

FlatParams::FlatParams(std::vector<torch::Tensor> params, const std::vector<std::string>& names, int world_size,
                       torch::ScalarType dtype, torch::Device device, int64_t group_numel,
                       const std::vector<bool>& expert,
                       int expert_parallel)
    : layout_(describe(params, names, expert), world_size, group_numel, expert_parallel), params_(std::move(params)) {
  params_flat_ = torch::zeros({layout_.padded_numel()}, torch::TensorOptions().dtype(dtype).device(device));
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    if (p.device() != device) {
      throw std::invalid_argument("FlatParams: parameter '" + names[i] + "' is on " + p.device().str() +
                                  " but the engine trains on " + device.str());
    }
    auto view = slot_view(params_flat_, i);
    view.copy_(p.detach());
    p.set_data(view);
  }
}

torch::Tensor FlatParams::slot_view(const torch::Tensor& flat, size_t i) const {
  const auto& slot = layout_.slots()[i];
  return flat.narrow(0, slot.offset, slot.numel).view(slot.shape);
}

void FlatParams::visit(const std::function<void(const std::string&, const torch::Tensor&)>& fn) const {
  for (size_t i = 0; i < params_.size(); ++i) fn(layout_.slots()[i].name, params_[i]);
}

torch::Tensor FlatParams::partition(int rank) const {
  auto out = torch::empty({layout_.partition_numel()}, params_flat_.options());
  const auto& groups = layout_.groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    out.narrow(0, groups[g].partition_offset, groups[g].shard_numel)
        .copy_(params_flat_.narrow(0, layout_.shard_offset(static_cast<int>(g), rank), groups[g].shard_numel));
  }
  return out;
}

void FlatParams::attach_grad_buffer() {
  if (!grads_flat_.defined()) grads_flat_ = torch::zeros_like(params_flat_);
  for (size_t i = 0; i < params_.size(); ++i) params_[i].mutable_grad() = slot_view(grads_flat_, i);
}

bool FlatParams::grads_attached() const {
  if (!grads_flat_.defined()) return false;
  const auto* base = static_cast<const char*>(grads_flat_.data_ptr());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& g = params_[i].grad();
    const auto* expected = base + layout_.slots()[i].offset * grads_flat_.element_size();
    if (!g.defined() || g.data_ptr() != expected) return false;
  }
  return true;
}

void FlatParams::keep_grads_attached() {
  if (!grads_attached()) zero_grads();
}

void FlatParams::check_grads_attached() const {
  if (!grads_attached()) {
    throw std::runtime_error(
        "a parameter's .grad no longer aliases the engine's gradient buffer after backward (was backward run with "
        "create_graph=true, or .grad replaced by a hook?); the engine needs gradients accumulated in place");
  }
}

void FlatParams::zero_grads() {
  grads_flat_.zero_();
  attach_grad_buffer();
}

}  // namespace dscpp
