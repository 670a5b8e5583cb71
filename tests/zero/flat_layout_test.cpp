// FlatLayout: grouping, per-group padding and shard offsets are exact.
#include <gtest/gtest.h>

#include "dscpp/zero/flat_layout.h"

namespace dscpp {
namespace {

std::vector<FlatLayout::Param> params(std::initializer_list<int64_t> sizes) {
  std::vector<FlatLayout::Param> out;
  int i = 0;
  for (int64_t n : sizes) out.push_back({"p" + std::to_string(i++), {n}});
  return out;
}

TEST(FlatLayout, PacksParamsIntoGroupsWithoutSplittingAny) {
  // group budget 10: [4, 5] | [7] | [12] (larger than the budget: alone) | [1, 2]
  FlatLayout layout(params({4, 5, 7, 12, 1, 2}), /*world_size=*/1, /*group_numel=*/10);
  ASSERT_EQ(layout.groups().size(), 4u);
  const std::vector<std::pair<int, int>> members = {{0, 2}, {2, 3}, {3, 4}, {4, 6}};
  for (size_t g = 0; g < members.size(); ++g) {
    EXPECT_EQ(layout.groups()[g].param_begin, members[g].first) << g;
    EXPECT_EQ(layout.groups()[g].param_end, members[g].second) << g;
  }
  const std::vector<int64_t> offsets = {0, 4, 9, 16, 28, 29};
  for (size_t i = 0; i < offsets.size(); ++i) EXPECT_EQ(layout.slots()[i].offset, offsets[i]) << i;
  EXPECT_EQ(layout.numel(), 31);
  EXPECT_EQ(layout.padded_numel(), 31);
}

TEST(FlatLayout, PadsEachGroupToAMultipleOfTheWorldSize) {
  FlatLayout layout(params({4, 5, 7, 12, 1, 2}), /*world_size=*/3, /*group_numel=*/10);
  // groups of 9, 7, 12, 3 elements → padded 9, 9, 12, 3
  const std::vector<int64_t> numel = {9, 9, 12, 3}, offset = {0, 9, 18, 30}, part = {0, 3, 6, 10};
  for (size_t g = 0; g < numel.size(); ++g) {
    EXPECT_EQ(layout.groups()[g].numel, numel[g]) << g;
    EXPECT_EQ(layout.groups()[g].offset, offset[g]) << g;
    EXPECT_EQ(layout.groups()[g].shard_numel, numel[g] / 3) << g;
    EXPECT_EQ(layout.groups()[g].partition_offset, part[g]) << g;
  }
  EXPECT_EQ(layout.slots()[2].offset, 9);   // the 7-element param starts group 1
  EXPECT_EQ(layout.slots()[4].offset, 30);  // group 3
  EXPECT_EQ(layout.padded_numel(), 33);
  EXPECT_EQ(layout.partition_numel(), 11);
  EXPECT_EQ(layout.shard_offset(1, 2), 9 + 2 * 3);
  EXPECT_THROW(layout.shard_offset(4, 0), std::out_of_range);
  EXPECT_THROW(layout.shard_offset(0, 3), std::out_of_range);
}

TEST(FlatLayout, RejectsBadArguments) {
  EXPECT_THROW(FlatLayout(params({1}), 0, 10), std::invalid_argument);
  EXPECT_THROW(FlatLayout(params({1}), 1, 0), std::invalid_argument);
}

}  // namespace
}  // namespace dscpp
