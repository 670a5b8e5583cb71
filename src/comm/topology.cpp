// The rank grid: rank = (pipe · data_size + data) · model_size + model.
#include "dscpp/comm/topology.h"

#include <sstream>
#include <stdexcept>

namespace dscpp {

const char* to_string(Axis axis) {
  switch (axis) {
    case Axis::kPipe: return "pipe";
    case Axis::kData: return "data";
    case Axis::kModel: return "model";
  }
  return "?";
}

ProcessTopology::ProcessTopology(int world_size, int pipe, int model) : pipe_(pipe), data_(0), model_(model) {
  if (world_size < 1 || pipe < 1 || model < 1) {
    throw std::invalid_argument("topology: world size " + std::to_string(world_size) + ", pipeline stages " +
                                std::to_string(pipe) + " and tensor-parallel size " + std::to_string(model) +
                                " must all be >= 1");
  }
  if (world_size % (pipe * model) != 0) {
    throw std::invalid_argument("topology: pipeline stages " + std::to_string(pipe) + " x tensor-parallel size " +
                                std::to_string(model) + " = " + std::to_string(pipe * model) +
                                " does not divide the world size " + std::to_string(world_size) +
                                "; the data-parallel size is world / (pipe x model) and must be whole");
  }
  data_ = world_size / (pipe * model);
}

int ProcessTopology::size(Axis axis) const {
  return axis == Axis::kPipe ? pipe_ : axis == Axis::kData ? data_ : model_;
}

GridCoord ProcessTopology::coord_of(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw std::out_of_range("topology: rank " + std::to_string(rank) + " is not in a world of " +
                            std::to_string(world_size()));
  }
  return {rank / (data_ * model_), (rank / model_) % data_, rank % model_};
}

int ProcessTopology::rank_of(const GridCoord& c) const {
  if (c.pipe < 0 || c.pipe >= pipe_ || c.data < 0 || c.data >= data_ || c.model < 0 || c.model >= model_) {
    throw std::out_of_range("topology: coordinate (pipe " + std::to_string(c.pipe) + ", data " +
                            std::to_string(c.data) + ", model " + std::to_string(c.model) + ") is outside the grid");
  }
  return (c.pipe * data_ + c.data) * model_ + c.model;
}

std::vector<int> ProcessTopology::group_along(Axis axis, int rank) const {
  GridCoord c = coord_of(rank);
  std::vector<int> out;
  for (int i = 0; i < size(axis); ++i) {
    c.along(axis) = i;
    out.push_back(rank_of(c));
  }
  return out;
}

std::string ProcessTopology::describe() const {
  std::ostringstream out;
  for (int r = 0; r < world_size(); ++r) {
    const auto c = coord_of(r);
    out << "rank " << r << ": pipe " << c.pipe << ", data " << c.data << ", model " << c.model << "\n";
  }
  return out.str();
}

ParallelGroups make_parallel_groups(std::shared_ptr<Comm> world, const ProcessTopology& topology) {
  if (topology.world_size() != world->world_size()) {
    throw std::invalid_argument("make_parallel_groups: the topology has " + std::to_string(topology.world_size()) +
                                " ranks, the comm " + std::to_string(world->world_size()));
  }
  const int rank = world->rank();
  const GridCoord coord = topology.coord_of(rank);
  // A group is named (its color) by its first rank, and ordered along the axis
  // (its key).
  auto split_along = [&](Axis axis) {
    return world->split(topology.group_along(axis, rank).front(), coord.along(axis));
  };
  auto pipe = split_along(Axis::kPipe);
  auto data = split_along(Axis::kData);
  auto model = split_along(Axis::kModel);
  return ParallelGroups{topology, coord, std::move(world), std::move(pipe), std::move(data), std::move(model)};
}

}  // namespace dscpp
