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

// MoE: experts form groups of their own, sharded over the world_size / P ranks that hold the same experts; data-parallel
// rank r holds shard r / P of them.
TEST(FlatLayout, ExpertGroupsAreShardedOverTheExpertDataParallelRanks) {
  auto p = params({10, 6, 6, 4});
  p[1].expert = p[2].expert = true;
  FlatLayout layout(p, /*world_size=*/4, /*group_numel=*/100, /*expert_parallel=*/2);
  ASSERT_EQ(layout.groups().size(), 3u);  // [p0] | [p1, p2] (experts) | [p3]
  const auto& experts = layout.groups()[1];
  EXPECT_TRUE(experts.expert);
  EXPECT_FALSE(layout.groups()[0].expert);
  EXPECT_EQ(experts.shards, 2);
  EXPECT_EQ(experts.numel, 12);
  EXPECT_EQ(experts.shard_numel, 6);
  EXPECT_EQ(layout.groups()[0].shard_numel, 3);  // 10 padded to 12 over 4 ranks
  EXPECT_EQ(layout.partition_numel(), 3 + 6 + 1);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(layout.shard_index(1, r), r / 2) << r;
  EXPECT_EQ(layout.shard_offset(1, 3), 12 + 6);
  // Ranks 0 and 1 hold the first expert parameter whole, ranks 2 and 3 the second.
  for (int r = 0; r < 4; ++r) {
    int found = 0;
    for (const auto& f : layout.shard_fragments(r)) {
      if (f.slot == 1 || f.slot == 2) {
        EXPECT_EQ(f.slot, r < 2 ? 1 : 2) << r;
        EXPECT_EQ(f.numel, 6);
        ++found;
      }
    }
    EXPECT_EQ(found, 1) << r;
  }
  EXPECT_THROW(FlatLayout(p, 4, 100, 3), std::invalid_argument);  // P must divide the world
}

TEST(FlatLayout, RejectsBadArguments) {
  EXPECT_THROW(FlatLayout(params({1}), 0, 10), std::invalid_argument);
  EXPECT_THROW(FlatLayout(params({1}), 1, 0), std::invalid_argument);
}

}  // namespace
}  // namespace dscpp
