// The two groups expert parallelism needs, cut from the data-parallel group as DeepSpeed's
// groups._create_expert_and_data_parallel cuts them: with data-parallel size D and ep_size P,
//   expert-parallel group       P consecutive data-parallel ranks [kP, (k+1)P): they hold different experts and
//                               exchange tokens (all-to-all);
//   expert-data-parallel group  the D/P ranks with the same index modulo P: they hold the same experts, and expert
//                               gradients are averaged over them (everything else over the whole data-parallel group).
#pragma once

#include <memory>
#include <vector>

#include "dscpp/comm/comm.h"

namespace dscpp::moe {

struct ExpertGroups {
  int ep_size = 1;
  std::shared_ptr<Comm> expert_parallel;       // size ep_size
  std::shared_ptr<Comm> expert_data_parallel;  // size D / ep_size
};

// Collective over `data` (every rank calls it, in the same order as its other splits). std::invalid_argument naming
// both numbers when ep_size < 1 or does not divide the data-parallel size.
ExpertGroups make_expert_groups(const std::shared_ptr<Comm>& data, int ep_size);

// The data-parallel ranks of each group, without a comm: what make_expert_groups forms (for plans and tests).
std::vector<std::vector<int>> expert_parallel_ranks(int data_size, int ep_size);
std::vector<std::vector<int>> expert_data_parallel_ranks(int data_size, int ep_size);

}  // namespace dscpp::moe
