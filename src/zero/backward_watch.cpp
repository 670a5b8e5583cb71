// BackwardWatch: counting a unit's autograd nodes down as backward runs them.
#include "dscpp/zero/backward_watch.h"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <limits>
#include <mutex>
#include <unordered_set>
#include <utility>

namespace dscpp {

struct BackwardWatch::State {
  std::mutex mutex;  // backward may run on a device's autograd thread
  std::function<void(int)> done;  // cleared when the watch goes
  std::vector<int64_t> pending;   // per key
  uint64_t epoch = 0;             // the micro-step nodes are counted in
};

namespace {

// Runs `ran` once: after its node has run (a post hook sees the node's outputs and passes them on untouched), or
// when the node goes without having run — a graph that will never run, such as the one torch's non-reentrant
// checkpoint records while it recomputes a forward only to keep its saved tensors.
class NodeRan final : public torch::autograd::FunctionPostHook {
 public:
  explicit NodeRan(std::function<void()> ran) : ran_(std::move(ran)) {}
  ~NodeRan() override {
    if (ran_) ran_();
  }
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    if (ran_) std::exchange(ran_, nullptr)();
    return outputs;
  }

 private:
  std::function<void()> ran_;
};

}  // namespace

BackwardWatch::BackwardWatch(std::function<void(int key)> done, int keys) : state_(std::make_shared<State>()) {
  state_->done = std::move(done);
  state_->pending.assign(static_cast<size_t>(keys), 0);
}

BackwardWatch::~BackwardWatch() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->done = nullptr;
}

void BackwardWatch::begin_micro_step() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  ++state_->epoch;
  std::fill(state_->pending.begin(), state_->pending.end(), 0);
}

uint64_t BackwardWatch::mark() { return at::sequence_number::peek(); }

void BackwardWatch::watch(int key, const std::vector<torch::Tensor>& outputs, uint64_t mark) {
  // AccumulateGrad nodes (a leaf's) are numbered UINT64_MAX: they read no saved tensor and end the walk.
  constexpr uint64_t kLeaf = std::numeric_limits<uint64_t>::max();
  std::vector<torch::autograd::Node*> stack;
  for (const auto& out : outputs) {
    if (out.defined() && out.requires_grad() && out.grad_fn()) stack.push_back(out.grad_fn().get());
  }
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> nodes;
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    const uint64_t number = node->sequence_nr();
    if (number < mark || number == kLeaf || !seen.insert(node).second) continue;  // before the unit, or a leaf
    nodes.push_back(node);
    for (const auto& edge : node->next_edges()) {
      if (edge.function) stack.push_back(edge.function.get());
    }
  }
  if (nodes.empty()) return;
  uint64_t epoch;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->pending.at(static_cast<size_t>(key)) += static_cast<int64_t>(nodes.size());
    epoch = state_->epoch;
  }
  auto ran = [state = state_, key, epoch] {
    std::function<void(int)> done;
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      if (epoch != state->epoch || !state->done) return;  // a node of an earlier micro-step's graph
      if (--state->pending[static_cast<size_t>(key)] != 0) return;
      done = state->done;
    }
    done(key);
  };
  for (auto* node : nodes) node->add_post_hook(std::make_unique<NodeRan>(ran));
}

}  // namespace dscpp
