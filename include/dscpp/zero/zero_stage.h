// ZeroStage: the strategy that decides what each rank stores and how gradients and parameters move.
// Chosen once at initialize; the engine calls the same methods whatever the stage, in the order of one step:
//   before_forward → (model, with run_unit per block) → after_forward → before_backward → (autograd) →
//   after_backward, each micro-step; at the boundary reduce_gradients → [engine: agreed norm/overflow, unscale +
//   clip, optimizer on master_params()] → publish_params → zero_grads.
// Only stage 3 does anything around the forward: stages 0-2 keep whole parameters on every rank.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/comm/comm.h"
#include "dscpp/config/config.h"
#include "dscpp/offload/state_store.h"
#include "dscpp/zero/flat_params.h"
#include "dscpp/zero/gather_unit.h"
#include "dscpp/zero/partition_unit.h"

namespace dscpp {

// Model-state bytes this rank holds, by kind (optimizer state is added by the engine).
struct StageMemory {
  int64_t params16 = 0;      // compute-dtype parameters (whole model, stages 0-2)
  int64_t grads16 = 0;       // compute-dtype gradients kept between micro-steps (whole model for 0-1, none for 2)
  int64_t master = 0;        // fp32 master weights on this rank (0 when they are the fp32 params themselves)
  int64_t buffers = 0;       // fp32 gradient partition for the optimizer and communication buckets
  // ZeRO-3 only. Persistent parameters stay gathered (their bytes are part of params16); the others are gathered
  // per block while in use, and gathered_peak is the most of those held at once since initialize.
  int64_t persistent = 0;
  int64_t gathered_peak = 0;
  int64_t secondary = 0;     // ZeRO-3 with hpZ: the secondary shards (1/hpz of every block), part of params16
  int64_t frozen = 0;        // frozen parameters (ZeRO-3: this rank's shards; Engine::memory adds whole ones), in params16
};

// Where a stage spent time waiting for communication, cumulative since initialize.
struct StageTimers {
  int64_t gathers = 0;        // ZeRO-3 parameter all-gathers issued (prefetched or on demand)
  double gather_wait_s = 0;   // time the forward/backward was blocked waiting for them
  StateStore::SwapStats param_swap;  // offload_param nvme: the parameter partition's swap file
};

class ZeroStage {
 public:
  virtual ~ZeroStage() = default;

  virtual int stage() const = 0;

  // Around the model's forward (Engine::forward) and each gather unit inside it (Engine::run_unit; `unit` indexes
  // the units the stage was built with, -1 for none of them). Stage 3 gathers parameters here; the others run the
  // forward as it is.
  virtual void before_forward() {}
  // `will_backward`: the forward's outputs need gradients (false for an evaluation forward, after which no
  // backward comes to release what it gathered).
  virtual void after_forward(bool /*will_backward*/) {}
  torch::Tensor run_unit(int unit, const std::function<torch::Tensor()>& forward) {
    enter_unit(unit);
    auto out = forward();
    leave_unit(unit, {out});
    return out;
  }
  // run_unit in parts, for a front end that runs each unit's forward itself (Python's module hooks): enter_unit
  // before it, leave_unit after it with the forward's tensor outputs.
  virtual void enter_unit(int /*unit*/) {}
  virtual void leave_unit(int /*unit*/, const std::vector<torch::Tensor>& /*outputs*/) {}
  // Stage 3: `param` is read outside its unit's forward (a tied weight that another module uses, a parameter the
  // model's own forward reads): its group is gathered now if it is not, and stays gathered until its gradients are
  // in. Outside a forward, or for a parameter the stage does not partition, nothing happens.
  virtual void fetch_param(const torch::Tensor& /*param*/) {}
  // `param`'s whole value (compute dtype): the parameter itself, except under stage 3, which assembles it from the
  // ranks' shards (collective) unless it persists.
  virtual torch::Tensor whole_param(const torch::Tensor& param) { return param; }
  // Whether the stage keeps `param`, a frozen parameter (requires_grad false), partitioned (stage 3): its tensor is
  // then empty between uses, whole_param assembles it and write_frozen sets it.
  virtual bool partitions_frozen(const torch::Tensor& /*param*/) const { return false; }
  // `value` (whole, any dtype of the same shape) becomes frozen parameter `param`'s on this rank: under stage 3 this
  // rank's shard of it, elsewhere the tensor itself. Not collective: every rank writes the same value.
  virtual void write_frozen(const torch::Tensor& param, const torch::Tensor& value) {
    torch::NoGradGuard no_grad;
    param.copy_(value);
  }

  // Where the stage keeps frozen parameter `param` sharded between uses (stage 3, not persistent): the elements of
  // it, flattened, that this rank's shard holds, as {begin, numel} ({0, 0}: none). nullopt: the rank holds it whole,
  // and write_frozen takes its whole value. Lets a loader read only what a rank keeps.
  virtual std::optional<std::pair<int64_t, int64_t>> frozen_shard_range(const torch::Tensor& /*param*/) const {
    return std::nullopt;
  }
  // Sets those elements (`values`: numel of them, any floating dtype) on this rank. Not collective.
  virtual void write_frozen_shard(const torch::Tensor& /*param*/, const torch::Tensor& /*values*/) {
    throw std::logic_error("write_frozen_shard: this stage keeps no frozen parameter sharded");
  }

  // Around each micro-step's backward. Stage 2 reduces buckets as backward produces them and waits in
  // after_backward; the others only keep their gradient buffer attached.
  virtual void before_backward() = 0;
  virtual void after_backward() = 0;

  // At the accumulation boundary: leave this rank's fp32 gradient partition, summed over micro-steps, averaged
  // over ranks and still multiplied by the loss scale, in master_grads().
  virtual void reduce_gradients() = 0;

  // Instead of reduce_gradients, when the optimizer wants this rank's own gradient (the 1-bit optimizers after their
  // warm-up, FlatOptimizer::wants_local_gradients): leave it in master_grads(), summed over micro-steps, not
  // reduced, still multiplied by the loss scale. local_grad_sq_norm() is then ‖g‖² over the world size, so the
  // step's norm is the root mean square of the ranks' norms (inf/nan on any rank still makes it non-finite on all).
  // Stage 0 only: a partitioned stage keeps no whole gradient.
  virtual void keep_local_gradients() {
    throw std::logic_error("ZeRO stage " + std::to_string(stage()) + " cannot keep each rank's own gradient (the "
                           "1-bit optimizers need stage 0)");
  }

  // This rank's fp32 master partition and its gradient: what the optimizer updates. 1-D, same size.
  virtual torch::Tensor& master_params() = 0;
  virtual torch::Tensor& master_grads() = 0;

  // How the parameters are laid out and sharded. master_params() holds the whole padded flat buffer when
  // master_is_whole() (stage 0), else this rank's shard of every group in group order (the layout's partition).
  // Checkpoints address the master and optimizer state through it, whatever the stage.
  virtual const FlatLayout& layout() const = 0;
  virtual bool master_is_whole() const { return false; }
  // The fragments of the parameters `rank`'s master partition holds (every parameter whole when master_is_whole()),
  // and where a fragment of them starts in that partition.
  std::vector<ShardFragment> master_fragments(int rank) const;
  int64_t master_offset(const ShardFragment& fragment, int rank) const;

  // The master now lives in an offload store (offload_optimizer nvme): frees this stage's copy. After it,
  // master_params() is undefined and publishing goes through publish_range. Stages 1-3.
  virtual void release_master() = 0;

  // This rank's share of ‖g‖² (a 0-dim fp64 tensor): shares are disjoint across ranks and sum to the whole.
  virtual torch::Tensor local_grad_sq_norm() = 0;
  // The same share counting only the parameters (slots of layout()) `counted` accepts: under tensor parallelism,
  // the ones whose gradients other model-parallel ranks do not also hold. `rank` is this rank (in the stage's comm).
  torch::Tensor local_grad_sq_norm_of(const std::vector<bool>& counted, int rank);

  // After the optimizer: bring every rank's compute-dtype parameters up to date from the master partitions.
  virtual void publish_params() = 0;

  // The same, a piece at a time, for an optimizer that steps the master sub-group by sub-group on the host
  // (offload_optimizer): `values` are partition elements [begin, begin + values.numel()) after the update, in the
  // compute dtype, handed over in partition order. The stage starts publishing whatever is complete at once, so
  // it overlaps the next sub-group's step; finish_publish() completes it. Stages 1-3 (offload needs a partition).
  virtual void publish_range(int64_t begin, const torch::Tensor& values) = 0;
  virtual void finish_publish() = 0;

  virtual void zero_grads() = 0;

  // Calls fn(name, value) for every trainable parameter with its whole current value (compute dtype). Stage 3
  // assembles one parameter at a time for it, so it is collective there: every rank calls it.
  using ParamVisitor = std::function<void(const std::string& name, const torch::Tensor& value)>;
  virtual void visit_params(const ParamVisitor& fn) = 0;

  virtual StageMemory memory() const = 0;
  virtual StageTimers timers() const { return {}; }
};

// Where a partition lives when the config offloads it (zero_optimization.offload_optimizer, offload_param): a value
// chosen once when the engine is assembled, which the stages only read.
struct OffloadPolicy {
  OffloadDevice device = OffloadDevice::kNone;  // kCpu: host memory; kNvme: a swap file behind host buffers
  bool pin_memory = false;                      // page-locked host memory, where a GPU exists

  bool offloaded() const { return device != OffloadDevice::kNone; }
};

// Makes the NVMe store a partition lives in, from its sub-groups' sizes and its initial values.
using StateStoreFactory =
    std::function<std::unique_ptr<StateStore>(const std::vector<int64_t>& sub_group_sizes, const torch::Tensor& initial)>;

// What every stage is built from.
struct StageContext {
  std::shared_ptr<Comm> comm;
  // Mixture of Experts with expert parallelism: the expert-data-parallel group, over which the layout's expert
  // groups (ParamGroup::expert) are reduced and gathered; every other group goes over `comm`. The averaging factors
  // below are the same for both (the data-parallel size): an expert's gradient arrives summed over its
  // expert-parallel group's tokens by the all-to-all, so summing it over this group covers every rank's tokens once.
  std::shared_ptr<Comm> expert_comm;
  Comm& comm_for(const ParamGroup& group) const { return group.expert && expert_comm ? *expert_comm : *comm; }
  FlatParams* flat = nullptr;                   // stages 0-2: owned by the engine; outlives the stage
  std::optional<torch::ScalarType> comm_dtype;  // "communication_data_type"; nullopt = the compute dtype
  bool overlap_comm = false;                    // stage 2: reduce buckets while backward runs
  // "reduce_scatter" (stages 1-3): false all-reduces each gradient bucket whole and keeps this rank's part, as
  // DeepSpeed does; same sums, the whole bucket on every rank.
  bool reduce_scatter = true;
  // "allgather_bucket_size" (stages 1-2): a group's all-gather of the updated parameters is split so that each
  // collective gathers at most this many elements, as DeepSpeed's bucketed all-gather does.
  int64_t allgather_bucket_numel = 500'000'000;
  // Gradients are divided by grad_pre_divide before the sum over ranks and the sum multiplied by grad_post_scale,
  // which together average them (see make_stage_context for DeepSpeed's prescale / predivide rules).
  double grad_pre_divide = 1.0;
  double grad_post_scale = 1.0;
  // offload_optimizer: the fp32 master partition and the rank's gradient partition (fp32) live in host memory; each
  // bucket's reduced gradient is moved there as it arrives. On NVMe the master goes to the optimizer's store (the
  // engine's OptimizerOffload): no fp32 copy of the partition is made, and until the store has taken its initial
  // values (release_master) master_params() is the compute-dtype partition itself.
  OffloadPolicy optimizer_offload;
  // ZeRO++ qwZ, "zero_quantized_weights" (stage 3): the blocks' all-gathers, forward and backward, send int8 blocks
  // (GatherWire::kInt8). The persistent group, re-gathered once per step, and whole-parameter reads (a model save)
  // stay exact, as DeepSpeed's gathers after the step and for GatheredParameters do.
  bool quantized_weights = false;
  // ZeRO++ "zero_quantized_nontrainable_weights" (stage 3): the frozen groups' shards are kept as int8 blocks with an
  // fp32 scale each and gathered as they are (GatheredGroup::store_quantized), as DeepSpeed stores its frozen
  // parameters' partitions; the persistent ones stay exact, as DeepSpeed's persistent parameters keep their values.
  bool quantized_nontrainable_weights = false;
  // ZeRO++ hpZ, "zero_hpz_partition_size" (stage 3): the group of that many consecutive ranks this rank belongs to
  // (null: off). Each rank keeps a secondary shard of every block over it, so the gathers after a block's first
  // since the optimizer step (its backward, the next micro-steps) stay inside the group (GatheredGroup).
  std::shared_ptr<Comm> hpz_comm;
  // The ranks at this rank's position in every hpZ group (with hpz_comm: the two levels of qgZ's reduction).
  std::shared_ptr<Comm> hpz_across;
  // ZeRO++ qgZ, "zero_quantized_gradients" (stage 3): each group's gradient reduce-scatter is an all-to-all of 4-bit
  // blocks (comm/quantized_reduce_scatter.h), in two levels over hpz_comm and hpz_across where hpZ is on.
  bool quantized_gradients = false;
  // offload_param (stage 3): the 16-bit partition lives in host memory, copied to the device for each gather; on
  // NVMe in the store `param_store` makes, read for each gather, and the partition in memory is released.
  OffloadPolicy param_offload;
  StateStoreFactory param_store;  // offload_param nvme only; empty otherwise
};

// Collectives a stage keeps running at once: each holds a bucket.
constexpr size_t kMaxCollectivesInFlight = 2;

// Stage 0: plain data parallel. Every rank holds everything; gradients are all-reduced bucket by bucket at the
// boundary.
std::unique_ptr<ZeroStage> make_stage0(const StageContext& context);
// Stage 1: fp32 master and optimizer state sharded; gradients reduce-scattered at the boundary.
std::unique_ptr<ZeroStage> make_stage1(const StageContext& context);
// Stage 2: gradients sharded too; each bucket is reduce-scattered as soon as backward has produced it.
std::unique_ptr<ZeroStage> make_stage2(const StageContext& context);

// What stage 3 partitions instead of a FlatParams: the model's trainable parameters (cast to the compute dtype)
// and the blocks whose parameters are gathered and released together.
struct PartitionedModel {
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  std::vector<GatherUnit> units;  // in order
  // Units built already partitioned (partition_unit), their parameters pointing into their released buffers: the
  // stage takes their shards instead of reading values.
  std::vector<PrepartitionedUnit> prepartitioned;
  // Frozen parameters (requires_grad false, floating): partitioned as the trainable ones are, as DeepSpeed's ZeRO-3
  // partitions every parameter, in a partition of their own that no optimizer reads. A LoRA fine-tune's base model
  // is these: whole on every rank it would undo ZeRO-3.
  std::vector<torch::Tensor> frozen;
  std::vector<std::string> frozen_names;
};

// Stage 3: the 16-bit parameters sharded too. Each rank keeps 1/N of every group; a unit's group is gathered
// for its forward, again for its backward, and released after each; gradients are reduce-scattered as each
// group's backward finishes. Every rank starts from rank 0's values. Reads the stage3_* settings of `zero`
// (elements): prefetch_bucket_size, param_persistence_threshold and model_persistence_threshold (zero/persistence.h),
// max_live_parameters, max_reuse_distance.
// A prepartitioned unit whose parameters are the group the stage forms for them is adopted as it is; one regrouped
// since (another persistence threshold, other units) is gathered whole while its parameters' new group is built.
std::unique_ptr<ZeroStage> make_stage3(const StageContext& context, PartitionedModel model, const ZeroConfig& zero);

}  // namespace dscpp
