// StateStore: where offloaded state lives between uses, handed out one sub-group at a time so only the sub-groups in
// use need to be in memory. For the optimizer: the fp32 master partition and each optimizer state tensor (its
// "kinds"), in sub-groups of zero_optimization.sub_group_size elements. For ZeRO-3's offloaded parameters: the
// 16-bit partition, one sub-group per group shard. In host memory the slices are views; on NVMe they are read ahead
// and written behind.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace dscpp {

// Sub-groups of `sub_group_size` covering `numel` elements (the last one shorter).
std::vector<int64_t> uniform_sub_groups(int64_t numel, int64_t sub_group_size);

class StateStore {
 public:
  // Consecutive sub-groups of these sizes, the same for every kind.
  explicit StateStore(std::vector<int64_t> sub_group_sizes);
  virtual ~StateStore() = default;
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  int64_t numel() const { return begins_.back(); }
  int sub_groups() const { return static_cast<int>(begins_.size()) - 1; }
  int64_t sub_group_begin(int i) const { return begins_.at(static_cast<size_t>(i)); }
  int64_t sub_group_numel(int i) const;
  int64_t largest_sub_group() const { return largest_; }

  // A hint: sub-group i will be acquired soon (a swapping store starts reading it). Stores read i + 1 ahead on
  // their own when acquiring i in order; an owner with another order (ZeRO-3's parameters) says which.
  virtual void prefetch(int /*i*/) {}

  // Sub-group i's slices: the master first, then the optimizer's state in FlatOptimizer::state_kinds() order. They
  // stay valid until release(i). A step acquires 0, 1, ... in order and releases each before acquiring the next,
  // so a store that swaps can read i + 1 ahead while i steps and write i back while i + 1 steps.
  virtual std::vector<torch::Tensor> acquire(int i) = 0;
  // Done with sub-group i. `modified`: its slices were updated in place, so a swapping store writes them back (in
  // the background).
  virtual void release(int i, bool modified = true) = 0;
  // Returns once every write-back has completed.
  virtual void flush() {}

  // What a swapping store has reserved, moved and made its caller wait for since it was made (all zero in memory).
  struct SwapStats {
    int64_t file_bytes = 0;     // reserved on disk
    int64_t read_bytes = 0;
    int64_t written_bytes = 0;
    double wait_s = 0;          // time acquire, release and flush blocked on I/O
  };
  virtual SwapStats stats() const { return {}; }

  // Random access between steps, for checkpoints and weight loading, through acquire and release: elements
  // [offset, offset + n) of `kind` (0: the master, k: the optimizer's state kind k - 1).
  void read(int kind, int64_t offset, torch::Tensor out);
  struct Update {
    int kind;
    int64_t offset;
    torch::Tensor values;
  };
  // Applies every update, acquiring and writing back each sub-group they touch once.
  void write(const std::vector<Update>& updates);

 private:
  // The pieces of [offset, offset + n) in each sub-group: (sub-group, start within it, count, start in the range).
  struct Piece {
    int sub_group;
    int64_t within;
    int64_t count;
    int64_t at;
  };
  std::vector<Piece> pieces(int64_t offset, int64_t n) const;

  std::vector<int64_t> begins_;  // sub-group i is [begins_[i], begins_[i + 1])
  int64_t largest_ = 0;
};

// The state in memory: the stage's master partition and the optimizer's own state tensors (offload to the CPU puts
// both in host memory). acquire and release hand out views; nothing moves.
std::unique_ptr<StateStore> make_resident_store(torch::Tensor master, std::vector<torch::Tensor> state,
                                                int64_t sub_group_size);

}  // namespace dscpp
