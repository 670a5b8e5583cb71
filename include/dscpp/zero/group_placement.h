// GroupPlacement: which ZeRO-3 group each parameter goes to, before the layouts number them. A parameter's kind is
// 0 (persistent: small enough to stay whole, persistence.h), 1 (the root: no unit holds it) or 2 + u (unit u, the
// first unit that holds it). Trainable and frozen parameters are placed by the same rule, in that order, so a
// unit's frozen base goes with its adapters.
#pragma once

#include <string>
#include <vector>

#include "dscpp/config/config.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {

struct GroupPlacement {
  std::vector<int> kind_of_param;      // per PartitionedModel::params
  std::vector<int> kind_of_frozen;     // per PartitionedModel::frozen
  std::vector<std::string> kind_name;  // per kind, for errors and the log
};

GroupPlacement place_groups(const PartitionedModel& model, const ZeroConfig& zero);

// `params` with their names, appended to the `out_` vectors ordered by kind (`kind_of[i]` < `kinds`), stable within a
// kind, each with its kind: the order layout_params wants.
void order_by_kind(const std::vector<torch::Tensor>& params, const std::vector<std::string>& names,
                   const std::vector<int>& kind_of, size_t kinds, std::vector<torch::Tensor>& out_params,
                   std::vector<std::string>& out_names, std::vector<int>& out_kinds);

// The parameters (ordered by kind) as a FlatLayout takes them: a group starts where a kind does, so each kind is one
// group of the layout.
std::vector<FlatLayout::Param> layout_params(const std::vector<std::string>& names,
                                             const std::vector<torch::Tensor>& params, const std::vector<int>& kinds);

}  // namespace dscpp
