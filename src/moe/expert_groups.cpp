// Expert-parallel and expert-data-parallel groups: two splits of the data-parallel group.
#include "dscpp/moe/expert_groups.h"

#include <stdexcept>
#include <string>

namespace dscpp::moe {
namespace {

void check_sizes(int data_size, int ep_size) {
  if (ep_size < 1 || data_size % ep_size != 0) {
    throw std::invalid_argument("MoE ep_size " + std::to_string(ep_size) + " must divide the data-parallel size " +
                                std::to_string(data_size) + " (the ranks each expert-parallel group is cut from)");
  }
}

}  // namespace

ExpertGroups make_expert_groups(const std::shared_ptr<Comm>& data, int ep_size) {
  const int d = data->world_size(), r = data->rank();
  check_sizes(d, ep_size);
  ExpertGroups groups;
  groups.ep_size = ep_size;
  groups.expert_parallel = data->split(r / ep_size, r);
  groups.expert_data_parallel = data->split(r % ep_size, r);
  return groups;
}

std::vector<std::vector<int>> expert_parallel_ranks(int data_size, int ep_size) {
  check_sizes(data_size, ep_size);
  std::vector<std::vector<int>> out(data_size / ep_size);
  for (int r = 0; r < data_size; ++r) out[r / ep_size].push_back(r);
  return out;
}

std::vector<std::vector<int>> expert_data_parallel_ranks(int data_size, int ep_size) {
  check_sizes(data_size, ep_size);
  std::vector<std::vector<int>> out(ep_size);
  for (int r = 0; r < data_size; ++r) out[r % ep_size].push_back(r);
  return out;
}

}  // namespace dscpp::moe
