// GroupPlacement: which ZeRO-3 group each parameter goes to, before the layouts number them. A parameter's kind is
// 0 (persistent: small enough to stay whole, persistence.h), 1 (the root: no unit holds it) or 2 + u (unit u, the
// first unit that holds it). Trainable and frozen parameters are placed by the same rule, in that order, so a
// unit's frozen base goes with its adapters.
#pragma once

#include <string>
#include <unordered_map>
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

// Units built partitioned (PrepartitionedUnit) against the groups: a unit whose parameters are exactly the group formed
// for their kind is adopted as it is (its shard moves into the partition); one regrouped since — a persistence
// threshold that now keeps its parameters whole, a leaf module that joins it with others, a parameter reassigned to
// another module, frozen parameters (which have a group of their own) — is gathered whole when the first group
// holding one of its parameters is built, and partitioned like any whole parameter.
struct PrepartitionedMatch {
  std::vector<int> of_kind;  // per kind: index into the prepartitioned units, or -1
  std::unordered_map<const c10::TensorImpl*, int> regrouped_of;  // a regrouped unit's parameter → that unit
  std::vector<int> regrouped_left;  // per prepartitioned unit: its parameters not yet in a built group
};
// `params` (ordered by kind, `kinds[i]` each, < `kind_count`) and `frozen`: the stage's trainable and frozen ones.
PrepartitionedMatch match_prepartitioned(const std::vector<torch::Tensor>& params, const std::vector<int>& kinds,
                                         const std::vector<torch::Tensor>& frozen, size_t kind_count,
                                         const std::vector<PrepartitionedUnit>& prepartitioned);

}  // namespace dscpp
