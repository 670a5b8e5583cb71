// GroupPlacement: DeepSpeed's persistence rule first, then the unit that holds the parameter.
#include "dscpp/zero/group_placement.h"

#include <unordered_map>
#include <unordered_set>

#include "dscpp/zero/persistence.h"

namespace dscpp {

GroupPlacement place_groups(const PartitionedModel& model, const ZeroConfig& zero) {
  std::unordered_map<const c10::TensorImpl*, int> unit_of;
  for (size_t u = 0; u < model.units.size(); ++u) {
    for (const auto& p : model.units[u].params) {
      unit_of.emplace(p.unsafeGetTensorImpl(), static_cast<int>(u));  // the first unit that holds it owns it
    }
  }
  GroupPlacement out;
  out.kind_name = {"persistent parameters", "root parameters (outside every unit)"};
  for (const auto& unit : model.units) out.kind_name.push_back(unit.name);
  PersistenceRule persistent(zero.stage3_param_persistence_threshold, zero.stage3_model_persistence_threshold);
  auto kind_of = [&](const torch::Tensor& p) {
    if (persistent.admit(p.numel())) return 0;
    auto it = unit_of.find(p.unsafeGetTensorImpl());
    return it != unit_of.end() ? 2 + it->second : 1;
  };
  for (const auto& p : model.params) out.kind_of_param.push_back(kind_of(p));
  for (const auto& p : model.frozen) out.kind_of_frozen.push_back(kind_of(p));
  return out;
}

void order_by_kind(const std::vector<torch::Tensor>& params, const std::vector<std::string>& names,
                   const std::vector<int>& kind_of, size_t kinds, std::vector<torch::Tensor>& out_params,
                   std::vector<std::string>& out_names, std::vector<int>& out_kinds) {
  for (int k = 0; k < static_cast<int>(kinds); ++k) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (kind_of[i] != k) continue;
      out_params.push_back(params[i]);
      out_names.push_back(names[i]);
      out_kinds.push_back(k);
    }
  }
}

std::vector<FlatLayout::Param> layout_params(const std::vector<std::string>& names,
                                             const std::vector<torch::Tensor>& params, const std::vector<int>& kinds) {
  std::vector<FlatLayout::Param> out;
  for (size_t i = 0; i < params.size(); ++i) {
    out.push_back({names[i], params[i].sizes().vec(), i == 0 || kinds[i] != kinds[i - 1]});
  }
  return out;
}

PrepartitionedMatch match_prepartitioned(const std::vector<torch::Tensor>& params, const std::vector<int>& kinds,
                                         const std::vector<torch::Tensor>& frozen, size_t kind_count,
                                         const std::vector<PrepartitionedUnit>& prepartitioned) {
  PrepartitionedMatch m;
  std::unordered_map<const c10::TensorImpl*, size_t> index_of;
  for (size_t i = 0; i < params.size(); ++i) index_of.emplace(params[i].unsafeGetTensorImpl(), i);
  std::unordered_set<const c10::TensorImpl*> partitioned;  // trainable and frozen
  for (const auto& p : params) partitioned.insert(p.unsafeGetTensorImpl());
  for (const auto& p : frozen) partitioned.insert(p.unsafeGetTensorImpl());
  m.of_kind.assign(kind_count, -1);
  m.regrouped_left.assign(prepartitioned.size(), 0);
  for (size_t k = 0; k < prepartitioned.size(); ++k) {
    const auto& pre = prepartitioned[k];
    if (pre.params.empty()) continue;
    std::vector<const c10::TensorImpl*> built;
    for (const auto& p : pre.params) built.push_back(p.unsafeGetTensorImpl());
    if (auto first = index_of.find(built.front()); first != index_of.end()) {
      const int kind = kinds[first->second];
      if (kind >= 1 && m.of_kind[kind] < 0) {
        std::vector<const c10::TensorImpl*> grouped;
        for (size_t i = 0; i < params.size(); ++i) {
          if (kinds[i] == kind) grouped.push_back(params[i].unsafeGetTensorImpl());
        }
        if (grouped == built) {
          m.of_kind[kind] = static_cast<int>(k);
          continue;
        }
      }
    }
    // A unit holding frozen parameters is regrouped (its frozen ones have a group of their own). Parameters no
    // longer in the model (reassigned away) are left as they are: nothing reaches them.
    for (const auto* p : built) {
      if (!partitioned.count(p)) continue;
      m.regrouped_of.emplace(p, static_cast<int>(k));
      ++m.regrouped_left[k];
    }
  }
  return m;
}

}  // namespace dscpp
