// ActivationCheckpointing (DeepSpeed's deepspeed.checkpointing): run a block's forward without keeping
// its activations, keep only its input, and run the forward again during backward — with the same random draws, so
// dropout drops the same units — to get the block's gradients. Activation memory then grows with the number of
// blocks, not with what happens inside each one.
//
//   auto y = checkpointing.checkpoint([block](const torch::Tensor& x) { return block->forward(x); }, x);
//
// A block of several tensors (hidden states and a mask, say) and several results goes through the list form; each
// floating-point input is kept as below, any other (integer indices, a boolean mask) as it is.
//
// The config's activation_checkpointing section chooses where the kept input lives:
//   partition_activations           each rank of `partition_group` keeps 1/N of it; all-gathered before the recompute
//   cpu_checkpointing               in host memory (pinned where a GPU exists); copied back before the recompute
//   contiguous_memory_optimization  in one buffer of number_checkpoints slots allocated once, so long sequences do not
//                                   fragment the allocator with short-lived inputs
//   synchronize_checkpoint_boundary the device is synchronized before and after each checkpointed forward
//   profile                         time each checkpointed forward and recompute (stats(); the engine logs them)
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/comm.h"
#include "dscpp/config/config.h"

namespace dscpp {

struct CheckpointStats {
  int64_t checkpoints = 0;        // checkpointed forwards run
  int64_t recomputes = 0;         // of them, recomputed in backward
  int64_t saved_bytes = 0;        // kept inputs now (this rank's part when partitioned)
  int64_t peak_saved_bytes = 0;   // the most kept at once since creation
  double forward_s = 0;           // profile: time in checkpointed forwards
  double recompute_s = 0;         // profile: time in recomputes (the block's forward again, not its backward)
};

class ActivationCheckpointing {
 public:
  using Block = std::function<torch::Tensor(const torch::Tensor& input)>;
  using ListBlock = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>& inputs)>;

  // `partition_group`: the ranks that hold the same activations (a tensor- or sequence-parallel group), over which
  // partition_activations splits each kept input. Null or one rank: nothing to split. Throws ConfigError for
  // contiguous_memory_optimization without a positive number_checkpoints.
  ActivationCheckpointing(const ActivationCheckpointingConfig& config, std::shared_ptr<Comm> partition_group);
  ~ActivationCheckpointing();
  ActivationCheckpointing(const ActivationCheckpointing&) = delete;
  ActivationCheckpointing& operator=(const ActivationCheckpointing&) = delete;

  // block(input), keeping only `input` for backward. `block` is called again during backward, so it must stay
  // callable until then and compute the same function; it must return a new tensor (not a view of its input).
  // Without grad mode (evaluation) it is a plain call. With partition_activations every rank of the group must
  // checkpoint the same blocks in the same order, forward and backward, with inputs of the same shape.
  torch::Tensor checkpoint(Block block, const torch::Tensor& input);

  // The same over several inputs and results: block(inputs), keeping only `inputs`. The gradient of every input that
  // requires it flows from whichever results reach the loss; results that are not floating point come back without
  // a gradient history, as torch.utils.checkpoint's do. Empty `inputs` is an error (there would be nothing to keep).
  std::vector<torch::Tensor> checkpoint(ListBlock block, const std::vector<torch::Tensor>& inputs);

  // A new forward starts: contiguous_memory_optimization hands out its slots from the first again. The engine
  // calls it at each Engine::forward.
  void begin_forward();

  CheckpointStats stats() const;

  // What was kept and where: where the memory went, for the log.
  struct Ledger;
  // The buffer of contiguous_memory_optimization: number_checkpoints slots, each in use from its forward to its
  // recompute.
  struct Slots;

 private:
  ActivationCheckpointingConfig config_;
  std::shared_ptr<Comm> group_;  // null: nothing to partition over
  std::shared_ptr<Ledger> ledger_;  // shared with the graph's nodes, which may outlive this object
  std::shared_ptr<Slots> slots_;
};

// "activation checkpointing: 12 checkpoints, 12 recomputes; kept inputs 1.5 MB (peak 18 MB); forward 12.3 ms,
// recompute 11.9 ms" (times only with profile).
std::string describe(const CheckpointStats& stats, bool with_times);

}  // namespace dscpp
