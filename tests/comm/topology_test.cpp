// The rank grid without processes: DeepSpeed's order (model fastest, then data, then pipe), each rank's group along
// each axis, and the errors for grids the world does not fit.
#include <gtest/gtest.h>

#include "dscpp/comm/topology.h"

namespace dscpp::testing {
namespace {

using Ranks = std::vector<int>;

// 8 ranks as pipe 2 × data 2 × model 2: the layout of DeepSpeed's PipeModelDataParallelTopology(2, 2, 2).
TEST(ProcessTopology, ModelVariesFastestThenDataThenPipe) {
  const ProcessTopology t(8, /*pipe=*/2, /*model=*/2);
  EXPECT_EQ(t.data(), 2);
  const std::vector<GridCoord> want = {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1},
                                       {1, 0, 0}, {1, 0, 1}, {1, 1, 0}, {1, 1, 1}};
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(t.coord_of(r), want[r]) << "rank " << r;
    EXPECT_EQ(t.rank_of(want[r]), r);
  }
  EXPECT_EQ(t.group_along(Axis::kModel, 2), (Ranks{2, 3}));
  EXPECT_EQ(t.group_along(Axis::kData, 5), (Ranks{5, 7}));
  EXPECT_EQ(t.group_along(Axis::kPipe, 3), (Ranks{3, 7}));
  EXPECT_EQ(t.describe().substr(0, 35), "rank 0: pipe 0, data 0, model 0\nran");
}

TEST(ProcessTopology, UnsplitAxesAreGroupsOfOne) {
  const ProcessTopology pure_data(4, 1, 1);
  EXPECT_EQ(pure_data.data(), 4);
  EXPECT_EQ(pure_data.group_along(Axis::kData, 2), (Ranks{0, 1, 2, 3}));
  EXPECT_EQ(pure_data.group_along(Axis::kModel, 2), (Ranks{2}));
  const ProcessTopology pipe_only(4, 4, 1);
  EXPECT_EQ(pipe_only.group_along(Axis::kPipe, 0), (Ranks{0, 1, 2, 3}));
  EXPECT_EQ(pipe_only.group_along(Axis::kData, 1), (Ranks{1}));
  // tp 2 × dp 3: the model groups are adjacent pairs.
  const ProcessTopology tp(6, 1, 2);
  EXPECT_EQ(tp.group_along(Axis::kModel, 4), (Ranks{4, 5}));
  EXPECT_EQ(tp.group_along(Axis::kData, 4), (Ranks{0, 2, 4}));
}

TEST(ProcessTopology, AWorldTheGridDoesNotDivideIsNamed) {
  try {
    ProcessTopology(6, 4, 1);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline stages 4 x tensor-parallel "
                                         "size 1 = 4 does not divide the world "
                                         "size 6"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ProcessTopology(4, 0, 1), std::invalid_argument);
  EXPECT_THROW(ProcessTopology(4, 2, 2).coord_of(4), std::out_of_range);
  EXPECT_THROW(ProcessTopology(4, 2, 2).rank_of({0, 1, 0}),
               std::out_of_range);  // data has size 1
}

}  // namespace
}  // namespace dscpp::testing
