// Activation checkpointing: a checkpointed forward runs under no_grad and its output gets one autograd node of ours,
// RecomputeBlock, whose backward rebuilds the input, runs the block again with grad and the forward's generator
// state, and backpropagates through that fresh graph (a nested backward, as torch.utils.checkpoint's reentrant
// variant does). The parameters' gradients accumulate there as in any backward, so the ZeRO stages' gradient hooks
// see them unchanged; the node returns the input's gradient to the outer graph.
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
  torch::Tensor buffer;       // (count, slot_numel), allocated at the first forward that needs more room
  std::vector<bool> in_use;   // a slot's input is kept until its recompute
  int64_t next = 0;           // the slot the next checkpoint of this forward takes
};

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// One checkpointed block's input, as kept for its recompute.
struct KeptInput {
  torch::Tensor data;            // the input, this rank's padded part of it, or a slot of the contiguous buffer
  std::vector<int64_t> sizes;    // the input's shape
  torch::Device device{torch::kCPU};  // where the input was (and the recompute runs)
  int64_t numel = 0;
  int partitions = 1;            // > 1: `data` is this rank's 1/partitions of the flattened, zero-padded input
  int slot = -1;                 // contiguous_memory_optimization: the slot `data` lives in
  int64_t bytes = 0;             // what this rank keeps for the recompute
};

class RecomputeBlock final : public torch::autograd::Node {
 public:
  RecomputeBlock(ActivationCheckpointing::Block block, KeptInput kept, RngState rng, bool input_requires_grad,
                 const ActivationCheckpointingConfig& config, std::shared_ptr<Comm> group,
                 std::shared_ptr<ActivationCheckpointing::Ledger> ledger,
                 std::shared_ptr<ActivationCheckpointing::Slots> slots)
      : block_(std::move(block)), kept_(std::move(kept)), rng_(std::move(rng)),
        input_requires_grad_(input_requires_grad), config_(config), group_(std::move(group)),
        ledger_(std::move(ledger)), slots_(std::move(slots)) {}

  ~RecomputeBlock() override { release(); }

  std::string name() const override { return "dscpp::CheckpointedBlockBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    if (!kept_.data.defined()) {
      throw std::logic_error("activation checkpointing: a checkpointed block's backward ran twice (its input is "
                             "released after the first); retain_graph is not supported through a checkpoint");
    }
    if (!grads.at(0).defined()) {  // the output did not reach the loss: nothing flows to the block
      release();
      return {torch::Tensor()};
    }
    const auto start = std::chrono::steady_clock::now();
    if (config_.synchronize_checkpoint_boundary) synchronize(kept_.device);
    torch::Tensor input = restore();
    release();  // a partitioned or offloaded input now lives in `input`; the kept part is not needed again
    auto x = input.detach().requires_grad_(input_requires_grad_);
    torch::Tensor out;
    {
      torch::AutoGradMode grad_mode(true);  // backward runs with grad mode off
      ScopedRngState same_draws(rng_, kept_.device);
      out = block_(x);
    }
    if (config_.synchronize_checkpoint_boundary) synchronize(kept_.device);
    ledger_->on_recompute(config_.profile ? seconds_since(start) : 0.0);
    torch::autograd::backward({out}, {grads[0]});
    block_ = nullptr;  // drops whatever the block's closure holds
    return {input_requires_grad_ ? x.grad() : torch::Tensor()};
  }

  void release_variables() override { release(); }

 private:
  torch::Tensor restore() const {
    auto part = kept_.data.to(kept_.device);  // cpu_checkpointing: back to where the block runs
    if (kept_.partitions == 1) return part.view(kept_.sizes);
    auto whole = torch::empty({part.numel() * kept_.partitions}, part.options());
    group_->all_gather(whole, part).wait();
    return whole.narrow(0, 0, kept_.numel).view(kept_.sizes);
  }

  void release() {
    if (!kept_.data.defined()) return;
    kept_.data = torch::Tensor();
    ledger_->on_release(kept_.bytes);
    if (kept_.slot >= 0) {
      std::lock_guard<std::mutex> lock(slots_->mutex);
      slots_->in_use[static_cast<size_t>(kept_.slot)] = false;
    }
  }

  ActivationCheckpointing::Block block_;
  KeptInput kept_;
  RngState rng_;
  bool input_requires_grad_;
  ActivationCheckpointingConfig config_;
  std::shared_ptr<Comm> group_;
  std::shared_ptr<ActivationCheckpointing::Ledger> ledger_;
  std::shared_ptr<ActivationCheckpointing::Slots> slots_;
};

// The slot of the contiguous buffer the next checkpoint's `part` goes in. The buffer is (re)allocated at the first
// checkpoint of a forward when it has no room; inputs of one forward must fit the slots the first one sized.
torch::Tensor take_slot(ActivationCheckpointing::Slots& slots, const torch::Tensor& part, bool pin, int& slot) {
  std::lock_guard<std::mutex> lock(slots.mutex);
  if (slots.next >= slots.count) {
    throw std::runtime_error("activation_checkpointing.number_checkpoints is " + std::to_string(slots.count) +
                             ", but this forward checkpointed more blocks; set it to the number of checkpointed "
                             "blocks");
  }
  const bool fits = slots.buffer.defined() && slots.buffer.size(1) >= part.numel() &&
                    slots.buffer.scalar_type() == part.scalar_type() && slots.buffer.device() == part.device();
  if (!fits) {
    if (slots.next != 0) {
      throw std::runtime_error("activation_checkpointing.contiguous_memory_optimization: checkpoint " +
                               std::to_string(slots.next) + " of this forward keeps " + std::to_string(part.numel()) +
                               " elements, more than the first one's slots hold; checkpointed inputs must be alike");
    }
    for (bool used : slots.in_use) {
      if (used) {
        throw std::logic_error("activation_checkpointing.contiguous_memory_optimization: a forward started before "
                               "the previous one's backward; its kept inputs are still in use");
      }
    }
    slots.buffer = torch::empty({slots.count, part.numel()}, part.options().pinned_memory(pin));
  }
  slot = static_cast<int>(slots.next++);
  if (slots.in_use[static_cast<size_t>(slot)]) {
    throw std::logic_error("activation_checkpointing.contiguous_memory_optimization: slot " + std::to_string(slot) +
                           " still holds an input whose backward has not run; call begin_forward() only after "
                           "the previous forward's backward");
  }
  slots.in_use[static_cast<size_t>(slot)] = true;
  auto view = slots.buffer[slot].narrow(0, 0, part.numel());
  view.copy_(part);
  return view;
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
  if (!torch::GradMode::is_enabled()) return block(input);
  const auto device = input.device();
  const auto start = std::chrono::steady_clock::now();
  if (config_.synchronize_checkpoint_boundary) synchronize(device);
  auto rng = RngState::capture(device);
  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    out = block(input);
    // Our node becomes the output's history, so the output must be a tensor of its own.
    if (out.is_view() || out.is_alias_of(input)) out = out.clone();
  }
  if (config_.synchronize_checkpoint_boundary) synchronize(device);

  KeptInput kept;
  kept.sizes = input.sizes().vec();
  kept.device = device;
  kept.numel = input.numel();
  torch::Tensor part = input.detach();
  if (group_) {
    // This rank's contiguous 1/N of the flattened input, zero-padded so every rank's part has the same size.
    const int n = group_->world_size();
    const int64_t chunk = (kept.numel + n - 1) / n;
    const int64_t begin = std::min(kept.numel, chunk * group_->rank());
    const int64_t len = std::min(kept.numel, begin + chunk) - begin;
    auto mine = torch::zeros({chunk}, part.options());
    mine.narrow(0, 0, len).copy_(part.reshape(-1).narrow(0, begin, len));
    part = mine;
    kept.partitions = n;
  }
  const bool pin = device.is_cuda();
  if (config_.cpu_checkpointing && !part.device().is_cpu()) {
    auto host = torch::empty(part.sizes(), part.options().device(torch::kCPU).pinned_memory(pin));
    host.copy_(part);
    part = host;
  }
  if (config_.contiguous_memory_optimization) {
    part = take_slot(*slots_, part.reshape(-1), pin && part.device().is_cpu(), kept.slot);
  }
  kept.data = part;
  // A plain checkpoint keeps the input itself alive; its other forms are copies, and the input can go.
  kept.bytes = static_cast<int64_t>(part.nbytes());
  ledger_->on_checkpoint(kept.bytes, config_.profile ? seconds_since(start) : 0.0);

  std::shared_ptr<RecomputeBlock> node(
      new RecomputeBlock(std::move(block), std::move(kept), std::move(rng), input.requires_grad(), config_, group_,
                         ledger_, slots_),
      torch::autograd::deleteNode);
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::create_gradient_edge(out, node);
  return out;
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
