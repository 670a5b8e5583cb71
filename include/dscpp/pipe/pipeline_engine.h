// PipelineEngine: pipeline parallelism (DeepSpeed's PipelineModule + PipelineEngine). The model is a sequence of
// layers; each pipeline stage (ParallelGroups::pipe) runs a contiguous run of them, passes its output to the next
// stage and the gradient of its input back to the previous one (Comm::send/recv), in DeepSpeed's 1F1B order
// (train_schedule), over gradient_accumulation_steps micro-batches. Each stage trains its own layers with an Engine
// over the data-parallel group (ZeRO 0 or 1), whose gradient norm and loss are the whole pipeline's.
//
// One optimizer step, in order (train_batch):
//   every stage: train_schedule's receives, forwards, sends and backwards for micro-batches 0 … m − 1
//   → tied weights: each copy's gradient summed over the stages that hold one (DeepSpeed's ReduceTiedGrads)
//   → Engine::step on the boundary: gradients averaged over data parallelism, the norm over the whole replica,
//     clip, optimizer, schedule — the same on every stage, so the copies of a tied weight stay equal.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/comm/topology.h"
#include "dscpp/engine/engine.h"
#include "dscpp/pipe/partition.h"
#include "dscpp/pipe/schedule.h"

namespace dscpp {

// One layer of a pipeline model (DeepSpeed's LayerSpec / TiedLayerSpec).
struct PipeLayer {
  std::string name;  // for the log: "h.3"
  std::string type;  // its class, for partition "type:REGEX": "Block"
  // The modules whose parameters the layer uses, each under its path in the whole model ("h.3", "wte"), so a
  // stage's parameters keep the whole model's names. A module that layers on two stages name is tied (DeepSpeed's
  // TiedLayerSpec): each of those stages holds a copy, made equal at the start and kept equal by summing the copies'
  // gradients before every step. On one stage the layers share the module itself.
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> modules;
  // The layer's computation: one tensor in, one out (the activations a stage passes on).
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

struct PipelineModel {
  std::vector<PipeLayer> layers;
  // On the last stage: (the last layer's output, the micro-batch's labels) → the micro-batch's mean loss.
  std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& labels)> loss_fn;
};

// One micro-batch: the first stage reads `inputs`, the last stage `labels`; the others neither.
struct MicroBatch {
  torch::Tensor inputs;
  torch::Tensor labels;
};

// What the last train_batch cost this stage (bench/pipeline reads it).
struct PipeStepStats {
  double batch_s = 0;        // train_batch, from its start to the optimizer step (excluded)
  double idle_s = 0;         // of it, blocked on receives and on unfinished sends: the stage's bubble
  int peak_in_flight = 0;    // the most micro-batches whose activations the stage held at once
  // The most CPU tensor bytes above the batch's start the stage held at once (its activations, received inputs and
  // gradients in flight); -1 unless CpuMemoryTracker is installed.
  int64_t activation_peak = -1;
};

class PipelineEngine {
 public:
  // Builds this rank's stage: partitions `model.layers` over groups.pipe's stages by config.pipeline.partition,
  // gathers this stage's modules into one module under their model paths, connects the tie groups and builds the
  // stage's Engine over groups.data (options.comm, model_parallel_group, pipeline_group, world_group and
  // norm_counted_elsewhere are set here; options.model_parallel_params / _slices may name the whole model's sliced
  // parameters, of which the stage keeps its own). engine().save_checkpoint / load_checkpoint, called on every rank,
  // write and read one checkpoint of the whole model (each stage its own layers, a tied one once). Collective over groups.world. ConfigError for ZeRO stage 2 or 3 (DeepSpeed's
  // rule: pipelining accumulates gradients over micro-batches, which stage 2 partitions during backward) and for a
  // pipeline.stages other than the grid's; std::invalid_argument for more stages than layers.
  PipelineEngine(PipelineModel model, const Config& config, ParallelGroups groups, InitOptions options = {});

  // One optimizer step over gradient_accumulation_steps micro-batches: `micro_batch(k)` gives micro-batch k (called
  // on the first and last stages, in order). Returns the step's loss, the mean over the global batch, on every rank.
  // A peer stage that fails ends this with a CommError naming it (or the comm timeout), not a hang.
  double train_batch(const std::function<MicroBatch(int micro)>& micro_batch);

  Engine& engine() { return *engine_; }
  const Engine& engine() const { return *engine_; }
  int stage() const { return groups_.coord.pipe; }
  int stages() const { return groups_.topology.pipe(); }
  bool is_first_stage() const { return stage() == 0; }
  bool is_last_stage() const { return stage() == stages() - 1; }
  // Stage s runs layers [parts()[s], parts()[s + 1]).
  const std::vector<int>& parts() const { return parts_; }
  // This stage's layers as one module (parameter names are the whole model's).
  const std::shared_ptr<torch::nn::Module>& module() const { return module_; }
  // The model paths of the modules tied across stages, and which stages hold them.
  const std::vector<std::pair<std::string, std::vector<int>>>& ties() const { return ties_; }
  const PipeStepStats& last_stats() const { return stats_; }

 private:
  struct Tie {
    std::string path;
    std::shared_ptr<Comm> comm;  // the copies' stages of this replica; rank 0 is the earliest stage
    std::vector<torch::Tensor> params;
  };
  // The tie groups of ties_ this stage holds a copy in (collective over the world); names the copies whose gradient
  // an earlier stage counts in the norm.
  void connect_ties(std::set<std::string>& counted_elsewhere);
  std::string describe(const std::vector<LayerInfo>& infos, const std::vector<PipeLayer>& all) const;
  // The stage's layers, with activation checkpointing every activation_checkpoint_interval layers.
  torch::Tensor run_layers(const torch::Tensor& input);
  void forward(int micro, const MicroBatch& batch);
  void backward(int micro);
  void send_activation(int micro);
  void recv_activation(int micro);
  void send_grad(int micro);
  void recv_grad(int micro);
  void reduce_tied_grads();
  // A send in flight: what it sends stays alive until it is known complete.
  struct PendingSend {
    PipeOp op;  // kSendActivation or kSendGrad
    int micro;
    Handle handle;
    torch::Tensor tensor;
  };
  void keep_sending(PipeOp op, int micro, Handle handle, torch::Tensor tensor);
  // Waits for (already complete, see the callers) and drops the `op` sends of micro-batches <= `up_to`, so what they
  // hold is freed as the schedule goes rather than at the end of the batch.
  void release_sends(PipeOp op, int up_to);
  void wait_idle(Handle& handle);  // waits, counting the time as idle
  void sample_memory();            // folds the tracker's peak in before the engine resets it

  Config config_;
  ParallelGroups groups_;
  std::vector<PipeLayer> layers_;  // this stage's
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss_fn_;
  std::vector<int> parts_;
  std::shared_ptr<torch::nn::Module> module_;
  std::vector<std::pair<std::string, std::vector<int>>> ties_;
  std::vector<Tie> tie_groups_;
  std::unique_ptr<Engine> engine_;
  std::vector<PipeInstruction> schedule_;
  // Per micro-batch in flight: the stage's input (a received activation, whose gradient goes back), its output (or,
  // on the last stage, the loss) and the gradient received for it.
  std::vector<torch::Tensor> inputs_, outputs_, output_grads_;
  torch::Device device_{torch::kCPU};
  std::vector<PendingSend> sends_;
  int in_flight_ = 0;
  int64_t memory_base_ = 0;
  PipeStepStats stats_;
};

}  // namespace dscpp
