// BackwardWatch: when has a unit's backward run? A frozen parameter has no gradient to say its unit's backward is
// done with it (a trainable one's arrival does), and the next unit's gradient hook fires too early where branches
// interleave (a LoRA adapter beside its frozen base layer). So at a unit's exit the watch takes every autograd node
// its forward recorded — the nodes reachable from its outputs that were created since its entry (autograd numbers
// nodes in creation order, per thread) — and counts them down as backward runs them; at zero, every saved tensor the
// unit's backward reads has been read. A node that goes without running counts as run (it never will: a graph torch's
// non-reentrant checkpoint records while recomputing); one that stays and never runs (an output no loss depends on,
// kept alive) keeps its count above zero, and the caller's end-of-backward release covers it.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace dscpp {

class BackwardWatch {
 public:
  // `done(key)`: every node watched for `key` this micro-step has run (called from the autograd thread).
  explicit BackwardWatch(std::function<void(int key)> done, int keys);
  ~BackwardWatch();  // nodes still alive (a graph the program kept) report to nobody
  BackwardWatch(const BackwardWatch&) = delete;
  BackwardWatch& operator=(const BackwardWatch&) = delete;

  // A new micro-step: nodes of earlier graphs no longer count, and no key has any.
  void begin_micro_step();
  // At a unit's entry: where its nodes will start.
  static uint64_t mark();
  // At the unit's exit: the nodes reachable from `outputs` created since `mark` count for `key`.
  void watch(int key, const std::vector<torch::Tensor>& outputs, uint64_t mark);

 private:
  struct State;
  std::shared_ptr<State> state_;  // shared with the hooks on the nodes
};

}  // namespace dscpp
