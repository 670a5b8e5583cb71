// ProcessTopology: the rank grid of 3D parallelism, and ParallelGroups: one rank's communicators along its axes.
// The order is DeepSpeed's (PipeModelDataParallelTopology): the model axis varies fastest, then data, then pipe, so
// a model-parallel group is adjacent ranks (one node, the fastest links: it communicates every layer) and a pipeline
// stage is a contiguous block of ranks.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/comm.h"

namespace dscpp {

enum class Axis { kPipe, kData, kModel };
const char* to_string(Axis axis);  // "pipe", "data", "model"

struct GridCoord {
  int pipe = 0;
  int data = 0;
  int model = 0;
  int along(Axis axis) const { return axis == Axis::kPipe ? pipe : axis == Axis::kData ? data : model; }
  int& along(Axis axis) { return axis == Axis::kPipe ? pipe : axis == Axis::kData ? data : model; }
  bool operator==(const GridCoord& o) const { return pipe == o.pipe && data == o.data && model == o.model; }
};

class ProcessTopology {
 public:
  // `pipe` stages × `model` slices; data parallelism is what remains of the world. std::invalid_argument naming
  // the numbers when pipe × model does not divide world_size, or a size is < 1.
  ProcessTopology(int world_size, int pipe, int model);

  int world_size() const { return pipe_ * data_ * model_; }
  int size(Axis axis) const;
  int pipe() const { return pipe_; }
  int data() const { return data_; }
  int model() const { return model_; }

  GridCoord coord_of(int rank) const;  // std::out_of_range outside the grid, as rank_of
  int rank_of(const GridCoord& coord) const;
  // The ranks that share every coordinate with `rank` but `axis`, in that axis's order: `rank`'s group along it.
  std::vector<int> group_along(Axis axis, int rank) const;
  // One line per rank: "rank 5: pipe 1, data 0, model 1".
  std::string describe() const;

 private:
  int pipe_, data_, model_;
};

// One rank's place in the grid and a communicator along each axis (size 1 where that axis is not split: the
// single-process comm). ZeRO and everything that averages over data parallelism uses `data`.
struct ParallelGroups {
  ProcessTopology topology;
  GridCoord coord;
  std::shared_ptr<Comm> world, pipe, data, model;
  const std::shared_ptr<Comm>& along(Axis axis) const {
    return axis == Axis::kPipe ? pipe : axis == Axis::kData ? data : model;
  }
};

// Splits `world` along each axis of `topology` (collective over `world`: every rank calls it, in the same order as
// its other splits). std::invalid_argument when the topology's world size is not the comm's.
ParallelGroups make_parallel_groups(std::shared_ptr<Comm> world, const ProcessTopology& topology);

}  // namespace dscpp
