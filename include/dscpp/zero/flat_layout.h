// FlatLayout: where each parameter lives in one flat buffer, and how that buffer is sharded over ranks.
// Parameters are packed in order into groups of about `group_numel` elements (the communication buckets); each
// group is padded to a multiple of world_size and split into world_size equal shards, and rank r owns shard r of
// every group (FSDP-style per-group sharding). So every bucket reduce-scatters and all-gathers in equal chunks, and
// rank r's partition is the concatenation of its shards. Pure arithmetic: stages, checkpoints and the planner agree.
//
// Mixture of Experts with expert parallelism P: expert parameters form groups of their own, sharded over the
// expert-data-parallel group only (world_size / P ranks: the ones holding the same experts), where data-parallel
// rank r holds shard r / P (moe::make_expert_groups' numbering). Every rank's layout has the same shapes; only the
// expert parameters' names differ between expert-parallel ranks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dscpp {

struct ParamSlot {
  std::string name;             // the module's parameter name, e.g. "h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0;           // first element in the flat buffer
  int64_t numel = 0;
  int group = 0;                // index into FlatLayout::groups()
};

// The part of one parameter that lies in one rank's shard: elements [param_begin, param_begin + numel) of the
// flattened parameter, found at `flat_offset` in the flat buffer. A shard is contiguous and a parameter lies in
// one group, so a rank holds at most one fragment of each parameter.
struct ShardFragment {
  int slot = 0;                 // index into FlatLayout::slots()
  int64_t param_begin = 0;
  int64_t numel = 0;
  int64_t flat_offset = 0;
};

struct ParamGroup {
  int64_t offset = 0;           // first element in the flat buffer
  int64_t numel = 0;            // padded: a multiple of shards
  int64_t shard_numel = 0;      // numel / shards
  int64_t partition_offset = 0; // where this group's shard starts inside each rank's partition
  int param_begin = 0;          // slots [param_begin, param_end) belong to this group
  int param_end = 0;
  bool expert = false;          // expert parameters, sharded over the expert-data-parallel group
  int shards = 1;               // ranks the group is split over: world_size, or world_size / P for an expert group
};

class FlatLayout {
 public:
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    bool starts_group = false;  // close the open group before this parameter (ZeRO-3: one group per block)
    bool expert = false;        // an MoE expert's parameter (never in a group with other parameters)
  };

  // A parameter never straddles two groups; one larger than `group_numel` forms a group of its own.
  // `expert_parallel` (P) must divide world_size when there are expert parameters.
  FlatLayout(const std::vector<Param>& params, int world_size, int64_t group_numel, int expert_parallel = 1);

  const std::vector<ParamSlot>& slots() const { return slots_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }
  int world_size() const { return world_size_; }
  int expert_parallel() const { return expert_parallel_; }
  int64_t numel() const { return numel_; }                 // sum of parameter sizes, no padding
  int64_t padded_numel() const { return padded_numel_; }   // flat buffer size
  int64_t partition_numel() const { return partition_numel_; }

  // Which shard of group `group` data-parallel rank `rank` holds: `rank`, or in an expert group its index in its
  // expert-data-parallel group.
  int shard_index(int group, int rank) const;
  // First element of data-parallel rank `rank`'s shard of group `group`, in the flat buffer.
  int64_t shard_offset(int group, int rank) const;

  // The fragments of rank `rank`'s shards, in slot order (padding excluded). The shards of all ranks tile every
  // parameter exactly, which is what lets a checkpoint written under one layout be read under another.
  std::vector<ShardFragment> shard_fragments(int rank) const;
  // The fragment of parameter `slot` in rank `rank`'s shard, if it has one.
  std::optional<ShardFragment> fragment_of(int slot, int rank) const;
  // Where `fragment` (of rank `rank`'s shard) starts in that rank's partition.
  int64_t partition_offset(const ShardFragment& fragment, int rank) const;

 private:
  std::vector<ParamSlot> slots_;
  std::vector<ParamGroup> groups_;
  int world_size_;
  int expert_parallel_;
  int64_t numel_ = 0;
  int64_t padded_numel_ = 0;
  int64_t partition_numel_ = 0;
};

}  // namespace dscpp
