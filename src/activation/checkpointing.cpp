// Activation checkpointing: a checkpointed forward runs under no_grad and its results get one autograd node of ours,
// RecomputeBlock, whose backward rebuilds the inputs, runs the block again with grad and the forward's generator
// state, and backpropagates through that fresh graph (a nested backward, as torch.utils.checkpoint's reentrant
// variant does). The parameters' gradients accumulate there as in any backward, so the ZeRO stages' gradient hooks
// see them unchanged; the node returns the inputs' gradients to the outer graph.
#include "dscpp/activation/checkpointing.h"

#include <chrono>
#include <mutex>
#include <stdexcept>

#include "dscpp/activation/rng_state.h"
#include "dscpp/config/config_error.h"
#include "dscpp/monitor/step_log.h"

namespace dscpp {

struct ActivationCheckpointing::Ledger {
  mutable std::mutex mutex;
  CheckpointStats stats;

  // `seconds` are counted only with profile (0 otherwise).
  void on_checkpoint(int64_t kept_bytes, double seconds) {
    std::lock_guard<std::mutex> lock(mutex);
    ++stats.checkpoints;
    stats.forward_s += seconds;
    stats.saved_bytes += kept_bytes;
    stats.peak_saved_bytes = std::max(stats.peak_saved_bytes, stats.saved_bytes);
  }
  void on_recompute(double seconds) {
    std::lock_guard<std::mutex> lock(mutex);
    ++stats.recomputes;
    stats.recompute_s += seconds;
  }
  void on_release(int64_t kept_bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    stats.saved_bytes -= kept_bytes;
  }
};

struct ActivationCheckpointing::Slots {
  std::mutex mutex;
  int64_t count = 0;          // number_checkpoints
  // One buffer per kept activation of a checkpoint (its first, second, ... floating-point input), each (count,
  // slot_numel), allocated at the first forward that needs more room.
  std::vector<torch::Tensor> buffers;
  std::vector<bool> in_use;   // a slot's inputs are kept until its recompute
  int64_t next = 0;           // the slot the next checkpoint of this forward takes
};

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// One input of a checkpointed block, as kept for its recompute.
struct KeptInput {
  torch::Tensor data;            // the input, this rank's padded part of it, or a view of a contiguous slot
  std::vector<int64_t> sizes;    // the input's shape
  torch::Device device{torch::kCPU};  // where the input was (and the recompute runs)
  int64_t numel = 0;
  int partitions = 1;            // > 1: `data` is this rank's 1/partitions of the flattened, zero-padded input
  bool requires_grad = false;    // the recompute's copy of it requires grad, and its gradient flows back
  int64_t bytes = 0;             // what this rank keeps for the recompute
};

// What one checkpoint keeps: its inputs, and the contiguous slot (if any) their activations live in.
struct Kept {
  std::vector<KeptInput> inputs;
  int slot = -1;
  int64_t bytes = 0;
};

class RecomputeBlock final : public torch::autograd::Node {
 public:
  // `outputs`: for each of the block's results, whether it was given this node as its history (in order, so the
  // node's k-th gradient belongs to the k-th such result).
  RecomputeBlock(ActivationCheckpointing::ListBlock block, Kept kept, std::vector<bool> outputs, RngState rng,
                 const ActivationCheckpointingConfig& config, std::shared_ptr<Comm> group,
                 std::shared_ptr<ActivationCheckpointing::Ledger> ledger,
                 std::shared_ptr<ActivationCheckpointing::Slots> slots)
      : block_(std::move(block)), kept_(std::move(kept)), outputs_(std::move(outputs)), rng_(std::move(rng)),
        config_(config), group_(std::move(group)), ledger_(std::move(ledger)), slots_(std::move(slots)) {}

  ~RecomputeBlock() override { release(); }

  std::string name() const override { return "dscpp::CheckpointedBlockBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const size_t n_inputs = kept_.inputs.size();
    if (kept_.inputs.empty() || !kept_.inputs[0].data.defined()) {
      throw std::logic_error("activation checkpointing: a checkpointed block's backward ran twice (its input is "
                             "released after the first); retain_graph is not supported through a checkpoint");
    }
    bool any = false;
    for (const auto& g : grads) any = any || g.defined();
    if (!any) {  // no result reached the loss: nothing flows to the block
      release();
      return torch::autograd::variable_list(n_inputs);
    }
    const torch::Device device = kept_.inputs[0].device;
    const auto start = std::chrono::steady_clock::now();
    if (config_.synchronize_checkpoint_boundary) synchronize(device);
    std::vector<torch::Tensor> inputs;
    for (const auto& k : kept_.inputs) {
      inputs.push_back(restore(k).detach().requires_grad_(k.requires_grad));
    }
    release();  // a partitioned or offloaded input now lives in `inputs`; the kept part is not needed again
    std::vector<torch::Tensor> results;
    {
      torch::AutoGradMode grad_mode(true);  // backward runs with grad mode off
      ScopedRngState same_draws(rng_, device);
      results = block_(inputs);
    }
    if (config_.synchronize_checkpoint_boundary) synchronize(device);
    ledger_->on_recompute(config_.profile ? seconds_since(start) : 0.0);
    if (results.size() != outputs_.size()) {
      throw std::logic_error("activation checkpointing: the recompute returned " + std::to_string(results.size()) +
                             " results, the forward " + std::to_string(outputs_.size()) +
                             "; a checkpointed block must compute the same function both times");
    }
    // Backpropagate the results that reached the loss and have a history in the recompute (a result computed
    // from nothing that requires grad has none, and nothing to pass on).
    std::vector<torch::Tensor> roots, root_grads;
    for (size_t i = 0, k = 0; i < results.size(); ++i) {
      if (!outputs_[i]) continue;
      const auto& g = grads.at(k++);
      if (g.defined() && results[i].requires_grad()) {
        roots.push_back(results[i]);
        root_grads.push_back(g);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    block_ = nullptr;  // drops whatever the block's closure holds
    torch::autograd::variable_list input_grads;
    for (const auto& x : inputs) input_grads.push_back(x.requires_grad() ? x.grad() : torch::Tensor());
    return input_grads;
  }

  void release_variables() override { release(); }

 private:
  torch::Tensor restore(const KeptInput& k) const {
    auto part = k.data.to(k.device);  // cpu_checkpointing: back to where the block runs
    if (k.partitions == 1) return part.view(k.sizes);
    auto whole = torch::empty({part.numel() * k.partitions}, part.options());
    group_->all_gather(whole, part).wait();
    return whole.narrow(0, 0, k.numel).view(k.sizes);
  }

  void release() {
    if (kept_.inputs.empty() || !kept_.inputs[0].data.defined()) return;
    for (auto& k : kept_.inputs) k.data = torch::Tensor();
    ledger_->on_release(kept_.bytes);
    if (kept_.slot >= 0) {
      std::lock_guard<std::mutex> lock(slots_->mutex);
      slots_->in_use[static_cast<size_t>(kept_.slot)] = false;
    }
  }

  ActivationCheckpointing::ListBlock block_;
  Kept kept_;
  std::vector<bool> outputs_;
  RngState rng_;
  ActivationCheckpointingConfig config_;
  std::shared_ptr<Comm> group_;
  std::shared_ptr<ActivationCheckpointing::Ledger> ledger_;
  std::shared_ptr<ActivationCheckpointing::Slots> slots_;
};

// The slot of the contiguous buffers the next checkpoint's `parts` (its activations, flattened) go in, each into
// the buffer of its position. A buffer is (re)allocated at the first checkpoint of a forward when it has no room;
// the checkpoints of one forward must fit the slots the first one sized.
int take_slot(ActivationCheckpointing::Slots& slots, std::vector<torch::Tensor>& parts, bool pin) {
  std::lock_guard<std::mutex> lock(slots.mutex);
  if (slots.next >= slots.count) {
    throw std::runtime_error("activation_checkpointing.number_checkpoints is " + std::to_string(slots.count) +
                             ", but this forward checkpointed more blocks; set it to the number of checkpointed "
                             "blocks");
  }
  if (slots.buffers.size() < parts.size()) slots.buffers.resize(parts.size());
  for (size_t k = 0; k < parts.size(); ++k) {
    const auto& part = parts[k];
    auto& buffer = slots.buffers[k];
    const bool fits = buffer.defined() && buffer.size(1) >= part.numel() &&
                      buffer.scalar_type() == part.scalar_type() && buffer.device() == part.device();
    if (fits) continue;
    if (slots.next != 0) {
      throw std::runtime_error("activation_checkpointing.contiguous_memory_optimization: checkpoint " +
                               std::to_string(slots.next) + " of this forward keeps " + std::to_string(part.numel()) +
                               " elements in its input " + std::to_string(k) +
                               ", more than the first one's slots hold; checkpointed inputs must be alike");
    }
    for (bool used : slots.in_use) {
      if (used) {
        throw std::logic_error("activation_checkpointing.contiguous_memory_optimization: a forward started before "
                               "the previous one's backward; its kept inputs are still in use");
      }
    }
    buffer = torch::empty({slots.count, part.numel()}, part.options().pinned_memory(pin));
  }
  const int slot = static_cast<int>(slots.next++);
  if (slots.in_use[static_cast<size_t>(slot)]) {
    throw std::logic_error("activation_checkpointing.contiguous_memory_optimization: slot " + std::to_string(slot) +
                           " still holds an input whose backward has not run; call begin_forward() only after "
                           "the previous forward's backward");
  }
  slots.in_use[static_cast<size_t>(slot)] = true;
  for (size_t k = 0; k < parts.size(); ++k) {
    auto view = slots.buffers[k][slot].narrow(0, 0, parts[k].numel());
    view.copy_(parts[k]);
    parts[k] = view;
  }
  return slot;
}

}  // namespace

ActivationCheckpointing::ActivationCheckpointing(const ActivationCheckpointingConfig& config,
                                                 std::shared_ptr<Comm> partition_group)
    : config_(config), ledger_(std::make_shared<Ledger>()), slots_(std::make_shared<Slots>()) {
  if (config_.partition_activations && partition_group && partition_group->world_size() > 1) {
    group_ = std::move(partition_group);
  }
  if (config_.number_checkpoints && *config_.number_checkpoints < 1) {
    throw ConfigError("activation_checkpointing.number_checkpoints is " + std::to_string(*config_.number_checkpoints) +
                      "; it must be at least 1 (the number of checkpointed blocks per forward)");
  }
  if (config_.contiguous_memory_optimization) {
    if (!config_.number_checkpoints) {
      throw ConfigError("activation_checkpointing.contiguous_memory_optimization needs "
                        "activation_checkpointing.number_checkpoints: the number of checkpointed blocks per forward, "
                        "which sizes its buffer");
    }
    slots_->count = *config_.number_checkpoints;
    slots_->in_use.assign(static_cast<size_t>(slots_->count), false);
  }
}

ActivationCheckpointing::~ActivationCheckpointing() = default;

void ActivationCheckpointing::begin_forward() {
  std::lock_guard<std::mutex> lock(slots_->mutex);
  slots_->next = 0;
}

torch::Tensor ActivationCheckpointing::checkpoint(Block block, const torch::Tensor& input) {
  auto one = [block = std::move(block)](const std::vector<torch::Tensor>& inputs) {
    return std::vector<torch::Tensor>{block(inputs.at(0))};
  };
  return checkpoint(ListBlock(std::move(one)), std::vector<torch::Tensor>{input}).at(0);
}

std::vector<torch::Tensor> ActivationCheckpointing::checkpoint(ListBlock block,
                                                               const std::vector<torch::Tensor>& inputs) {
  if (inputs.empty()) {
    throw std::invalid_argument("activation checkpointing: a checkpointed block needs at least one tensor input");
  }
  for (const auto& input : inputs) {
    if (!input.defined()) throw std::invalid_argument("activation checkpointing: an input tensor is undefined");
  }
  if (!torch::GradMode::is_enabled()) return block(inputs);
  const auto device = inputs[0].device();
  const auto start = std::chrono::steady_clock::now();
  if (config_.synchronize_checkpoint_boundary) synchronize(device);
  auto rng = RngState::capture(device);
  std::vector<torch::Tensor> results;
  {
    torch::NoGradGuard no_grad;
    results = block(inputs);
  }
  if (config_.synchronize_checkpoint_boundary) synchronize(device);

  // Our node becomes each floating-point result's history, so each must be a tensor of its own: not a view, not
  // one of the inputs, not another result again.
  std::vector<bool> outputs(results.size(), false);
  for (size_t i = 0; i < results.size(); ++i) {
    auto& out = results[i];
    if (!out.defined() || !out.is_floating_point()) continue;
    bool shared = out.is_view();
    for (const auto& input : inputs) shared = shared || out.is_alias_of(input);
    for (size_t j = 0; j < i; ++j) shared = shared || (results[j].defined() && out.is_alias_of(results[j]));
    if (shared) out = out.clone();
    outputs[i] = true;
  }

  // The floating-point inputs are activations, kept as the config says; any other input is kept as it is.
  Kept kept;
  std::vector<torch::Tensor> parts;  // the activations' kept forms, in order
  std::vector<size_t> part_of;       // which input each is
  const bool pin = device.is_cuda();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& input = inputs[i];
    KeptInput k;
    k.sizes = input.sizes().vec();
    k.device = input.device();
    k.numel = input.numel();
    k.requires_grad = input.requires_grad();
    torch::Tensor part = input.detach();
    if (input.is_floating_point()) {
      if (group_) {
        // This rank's contiguous 1/N of the flattened input, zero-padded so every rank's part has the same size.
        const int n = group_->world_size();
        const int64_t chunk = (k.numel + n - 1) / n;
        const int64_t begin = std::min(k.numel, chunk * group_->rank());
        const int64_t len = std::min(k.numel, begin + chunk) - begin;
        auto mine = torch::zeros({chunk}, part.options());
        mine.narrow(0, 0, len).copy_(part.reshape(-1).narrow(0, begin, len));
        part = mine;
        k.partitions = n;
      }
      if (config_.cpu_checkpointing && !part.device().is_cpu()) {
        auto host = torch::empty(part.sizes(), part.options().device(torch::kCPU).pinned_memory(pin));
        host.copy_(part);
        part = host;
      }
      if (config_.contiguous_memory_optimization) {
        parts.push_back(part.reshape(-1));
        part_of.push_back(i);
      }
    }
    k.data = part;
    kept.inputs.push_back(std::move(k));
  }
  if (!parts.empty()) {
    kept.slot = take_slot(*slots_, parts, pin && parts[0].device().is_cpu());
    for (size_t p = 0; p < parts.size(); ++p) kept.inputs[part_of[p]].data = parts[p];
  }
  // A plain checkpoint keeps the inputs themselves alive; their other forms are copies, and the inputs can go.
  for (auto& k : kept.inputs) {
    k.bytes = static_cast<int64_t>(k.data.nbytes());
    kept.bytes += k.bytes;
  }
  ledger_->on_checkpoint(kept.bytes, config_.profile ? seconds_since(start) : 0.0);

  std::shared_ptr<RecomputeBlock> node(new RecomputeBlock(std::move(block), std::move(kept), outputs, std::move(rng),
                                                          config_, group_, ledger_, slots_),
                                       torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  for (size_t i = 0; i < results.size(); ++i) {
    if (outputs[i]) torch::autograd::create_gradient_edge(results[i], node);
  }
  return results;
}

CheckpointStats ActivationCheckpointing::stats() const {
  std::lock_guard<std::mutex> lock(ledger_->mutex);
  return ledger_->stats;
}

std::string describe(const CheckpointStats& s, bool with_times) {
  std::string line = "activation checkpointing: " + std::to_string(s.checkpoints) + " checkpoints, " +
                     std::to_string(s.recomputes) + " recomputes; kept inputs " +
                     format_bytes(static_cast<double>(s.saved_bytes)) + " (peak " +
                     format_bytes(static_cast<double>(s.peak_saved_bytes)) + ")";
  if (with_times) {
    char times[96];
    std::snprintf(times, sizeof times, "; forward %.2f ms, recompute %.2f ms", s.forward_s * 1e3, s.recompute_s * 1e3);
    line += times;
  }
  return line;
}

}  // namespace dscpp
