// GroupPlacement: DeepSpeed's persistence rule first, then the unit that holds the parameter.
#include "dscpp/zero/group_placement.h"

#include <unordered_map>

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

}  // namespace dscpp
