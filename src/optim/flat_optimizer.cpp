// make_flat_optimizer: picks the flat optimizer for the config's "optimizer" section and checks that the
// engine hands it tensors it can update.
#include "dscpp/optim/flat_optimizer.h"

#include <algorithm>
#include <cctype>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <variant>

#include "flat_optimizers.h"

namespace dscpp {
namespace detail {

void check_slice(const OptimizerSlice& slice, size_t state_count, const std::string& name) {
  const int64_t n = slice.param.defined() ? slice.param.numel() : 0;
  auto check = [&](const torch::Tensor& t, const std::string& what, bool fp32) {
    if (!t.defined() || t.dim() != 1 || t.numel() != n || (fp32 && t.scalar_type() != torch::kFloat32) ||
        t.device() != slice.param.device()) {
      throw std::invalid_argument(name + " update: " + what + " must be a 1-D " + (fp32 ? "fp32 " : "") +
                                  "tensor of " + std::to_string(n) + " elements on " +
                                  (slice.param.defined() ? slice.param.device().str() : std::string("?")) +
                                  " (the param slice's), got " +
                                  (t.defined() ? std::string(t.toString()) + " of " + std::to_string(t.numel()) +
                                                     " elements with " + std::to_string(t.dim()) + " dims on " +
                                                     t.device().str()
                                               : std::string("an undefined tensor")));
    }
  };
  check(slice.param, "param", true);
  check(slice.grad, "grad", true);
  if (slice.state.size() != state_count) {
    throw std::invalid_argument(name + " update: expected " + std::to_string(state_count) + " state slices, got " +
                                std::to_string(slice.state.size()));
  }
  for (size_t k = 0; k < slice.state.size(); ++k) check(slice.state[k], "state[" + std::to_string(k) + "]", true);
  if (slice.param16.defined()) check(slice.param16, "param16", false);
}

}  // namespace detail

void FlatOptimizer::step(torch::Tensor& param, const torch::Tensor& grad, double lr) {
  if (param.defined() && param.numel() != numel()) {
    throw std::invalid_argument(name() + " step: param has " + std::to_string(param.numel()) +
                                " elements, this optimizer's partition " + std::to_string(numel()));
  }
  OptimizerSlice whole{param, grad, {}, {}, std::nullopt};
  for (auto& [kind, tensor] : state_tensors()) whole.state.push_back(tensor);
  begin_step();
  update_at(whole, 0, lr);
}

namespace {

// Elements [begin, begin + n) of the slice (all of its tensors), with `weight_decay` if given.
OptimizerSlice sub_slice(const OptimizerSlice& slice, int64_t begin, int64_t n, std::optional<double> weight_decay) {
  OptimizerSlice out{slice.param.narrow(0, begin, n), slice.grad.narrow(0, begin, n), {}, {}, weight_decay};
  for (const auto& t : slice.state) out.state.push_back(t.narrow(0, begin, n));
  if (slice.param16.defined()) out.param16 = slice.param16.narrow(0, begin, n);
  return out;
}

}  // namespace

void FlatOptimizer::update_at(const OptimizerSlice& slice, int64_t offset, double lr) {
  if (group_ranges_.empty() || !slice.param.defined()) return update(slice, lr);
  const int64_t end = offset + slice.param.numel();
  int64_t at = offset;  // partition position: everything before it is updated
  for (const auto& r : group_ranges_) {
    const int64_t begin = std::max(r.begin, offset), stop = std::min(r.begin + r.numel, end);
    if (begin >= stop) continue;
    if (begin > at) update(sub_slice(slice, at - offset, begin - at, slice.weight_decay), lr);
    const GroupSettings& group = groups_[r.group];
    update(sub_slice(slice, begin - offset, stop - begin, group.weight_decay ? group.weight_decay : slice.weight_decay),
           group.lr.value_or(lr));
    at = stop;
  }
  if (at < end) update(sub_slice(slice, at - offset, end - at, slice.weight_decay), lr);
}

void FlatOptimizer::set_groups(std::vector<GroupSettings> groups, std::vector<GroupRange> ranges) {
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& g = groups[i];
    if ((g.weight_decay && !(*g.weight_decay >= 0)) || (g.lr && !(*g.lr >= 0))) {
      throw std::invalid_argument(name() + ": parameter group " + std::to_string(i) +
                                  "'s weight_decay and lr must be >= 0");
    }
  }
  std::vector<GroupRange> merged;
  int64_t previous_end = 0;
  for (const auto& r : ranges) {
    // An optimizer without state of its own (numel 0: offload to NVMe) updates the slices it is handed: no bound.
    if (r.numel < 0 || r.begin < previous_end || (numel() > 0 && r.begin + r.numel > numel())) {
      throw std::invalid_argument(name() + ": group range [" + std::to_string(r.begin) + ", " +
                                  std::to_string(r.begin + r.numel) + ") is not sorted, disjoint and inside the " +
                                  "partition of " + std::to_string(numel()));
    }
    if (r.group < 0 || r.group >= static_cast<int>(groups.size())) {
      throw std::invalid_argument(name() + ": group range [" + std::to_string(r.begin) + ", " +
                                  std::to_string(r.begin + r.numel) + ") names group " + std::to_string(r.group) +
                                  " of " + std::to_string(groups.size()));
    }
    previous_end = r.begin + r.numel;
    if (r.numel == 0) continue;
    if (!merged.empty() && merged.back().begin + merged.back().numel == r.begin && merged.back().group == r.group) {
      merged.back().numel += r.numel;
    } else {
      merged.push_back(r);
    }
  }
  groups_ = std::move(groups);
  group_ranges_ = std::move(merged);
}

GroupSettings FlatOptimizer::group_at(int64_t offset) const {
  // The last range beginning at or before `offset`, if it reaches it.
  auto it = std::upper_bound(group_ranges_.begin(), group_ranges_.end(), offset,
                             [](int64_t o, const GroupRange& r) { return o < r.begin; });
  if (it == group_ranges_.begin()) return {};
  --it;
  return offset < it->begin + it->numel ? groups_[it->group] : GroupSettings{};
}

void FlatOptimizer::set_partition_tensors(PartitionTensors tensors) {
  int64_t previous_end = 0;
  for (const auto& r : tensors.ranges) {
    if (r.numel < 0 || r.begin < previous_end || r.begin + r.numel > numel() || r.tensor < 0 ||
        r.tensor >= tensors.tensor_count) {
      throw std::invalid_argument(name() + ": tensor range [" + std::to_string(r.begin) + ", " +
                                  std::to_string(r.begin + r.numel) + ") of tensor " + std::to_string(r.tensor) +
                                  " is not sorted, disjoint and inside the partition of " + std::to_string(numel()) +
                                  " elements, or names no tensor of " + std::to_string(tensors.tensor_count));
    }
    previous_end = r.begin + r.numel;
  }
  tensors_ = std::move(tensors);
}

void FlatOptimizer::set_group_lr(int group, std::optional<double> lr) {
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    throw std::invalid_argument(name() + ": set_group_lr: no parameter group " + std::to_string(group) +
                                " (there are " + std::to_string(groups_.size()) + ")");
  }
  if (lr && !(*lr >= 0)) {
    throw std::invalid_argument(name() + ": set_group_lr: lr must be >= 0, got " + std::to_string(*lr));
  }
  groups_[group].lr = lr;
}

std::vector<std::string> FlatOptimizer::state_kinds() {
  std::vector<std::string> kinds;
  for (const auto& [kind, tensor] : state_tensors()) kinds.push_back(kind);
  return kinds;
}

namespace {

constexpr const char* kSupported = "supported: Adam, AdamW, SGD, Lion, Adagrad, Lamb";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// Whether `type` (any case; empty means "as the options say") names the options alternative T.
template <typename T>
bool type_matches(const std::string& type) {
  if (type.empty()) return true;
  const std::string t = lower(type);
  if constexpr (std::is_same_v<T, AdamOptions>) {
    return t == "adam" || t == "adamw";
  } else if constexpr (std::is_same_v<T, SgdOptions>) {
    return t == "sgd";
  } else if constexpr (std::is_same_v<T, LionOptions>) {
    return t == "lion";
  } else if constexpr (std::is_same_v<T, AdagradOptions>) {
    return t == "adagrad";
  } else if constexpr (std::is_same_v<T, OneBitAdamOptions>) {
    return t == "onebitadam";
  } else if constexpr (std::is_same_v<T, ZeroOneAdamOptions>) {
    return t == "zerooneadam";
  } else if constexpr (std::is_same_v<T, OneBitLambOptions>) {
    return t == "onebitlamb";
  } else {
    static_assert(std::is_same_v<T, LambOptions>, "every optimizer alternative needs a type name");
    return t == "lamb";
  }
}

}  // namespace

std::unique_ptr<FlatOptimizer> make_flat_optimizer(const OptimizerConfig& config, int64_t numel,
                                                   const torch::TensorOptions& options, OptimizerKernels kernels) {
  if (numel < 0) throw std::invalid_argument("make_flat_optimizer: numel must be >= 0, got " + std::to_string(numel));
  // Master weights and optimizer state are fp32 whatever the model's dtype.
  const torch::TensorOptions state_options = options.dtype(torch::kFloat32).requires_grad(false);

  return std::visit(
      [&](const auto& o) -> std::unique_ptr<FlatOptimizer> {
        using T = std::decay_t<decltype(o)>;
        if (!type_matches<T>(config.type)) {
          throw std::invalid_argument("optimizer.type \"" + config.type + "\" does not match its params, or is not " +
                                      kSupported);
        }
        if constexpr (std::is_same_v<T, AdamOptions>) {
          // As DeepSpeed: "AdamW" always decouples; "Adam" decouples unless adam_w_mode is false.
          const bool adamw_type = lower(config.type) == "adamw";
          const bool decoupled = adamw_type || o.adam_w_mode;
          return detail::make_flat_adam(o, decoupled, adamw_type ? "AdamW" : "Adam", numel, state_options,
                                       kernels);
        } else if constexpr (std::is_same_v<T, SgdOptions>) {
          return detail::make_flat_sgd(o, numel, state_options);
        } else if constexpr (std::is_same_v<T, LionOptions>) {
          return detail::make_flat_lion(o, numel, state_options);
        } else if constexpr (std::is_same_v<T, AdagradOptions>) {
          return detail::make_flat_adagrad(o, numel, state_options);
        } else if constexpr (std::is_same_v<T, LambOptions>) {
          return detail::make_flat_lamb(o, numel, state_options);
        } else {
          // They average over the data-parallel ranks: dscpp/onebit/ builds them with those.
          throw std::invalid_argument("optimizer.type \"" + config.type + "\" needs the data-parallel comm: build "
                                      "it with make_onebit_optimizer (dscpp/onebit/onebit_optimizer.h)");
        }
      },
      config.options);
}

}  // namespace dscpp
