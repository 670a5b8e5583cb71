// ZeroStage: the strategy that decides what each rank stores and how gradients and parameters move (SPEC §3.6).
// Chosen once at initialize; the engine calls the same methods whatever the stage, in the order of one step:
//   after_backward (each micro-step) → reduce_gradients (boundary) → [engine: overflow, clip, optimizer on the
//   master partition] → publish_params → zero_grads.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>

#include "dscpp/comm/comm.h"
#include "dscpp/zero/flat_params.h"

namespace dscpp {

// Model-state bytes this rank holds, by kind (SPEC §3.6 accounting; optimizer state is added by the engine).
struct StageMemory {
  int64_t params16 = 0;      // compute-dtype parameters (0 extra when they are the fp32 master)
  int64_t grads16 = 0;       // compute-dtype gradients
  int64_t master = 0;        // fp32 master partition
  int64_t master_grads = 0;  // fp32 gradient partition handed to the optimizer (0 when it aliases grads16)
  int64_t buffers = 0;       // communication buckets
};

class ZeroStage {
 public:
  virtual ~ZeroStage() = default;

  virtual int stage() const = 0;

  // Called after every micro-step's backward. Stages that reduce during backward flush pending buckets here.
  virtual void after_backward(bool boundary) = 0;

  // At the accumulation boundary: leave this rank's fp32 gradient partition, averaged over ranks (still
  // multiplied by the loss scale), in master_grads().
  virtual void reduce_gradients() = 0;

  // This rank's fp32 master partition and its gradient: what the optimizer updates. 1-D, same size.
  virtual torch::Tensor& master_params() = 0;
  virtual torch::Tensor& master_grads() = 0;

  // The part of master_grads() this rank accounts for in global reductions (gradient norm, overflow): disjoint
  // across ranks and together covering every parameter once.
  virtual torch::Tensor grad_shard() = 0;

  // After the optimizer: bring every rank's compute-dtype parameters up to date from the master partitions.
  virtual void publish_params() = 0;

  virtual void zero_grads() = 0;

  virtual StageMemory memory() const = 0;
};

// What every stage is built from.
struct StageContext {
  std::shared_ptr<Comm> comm;
  FlatParams* flat = nullptr;    // owned by the engine; outlives the stage
  int64_t reduce_bucket_size = 500'000'000;     // elements
  int64_t allgather_bucket_size = 500'000'000;  // elements
  bool overlap_comm = false;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
};

// Stage 0: plain data parallel. Every rank holds everything; gradients are all-reduced at the boundary.
std::unique_ptr<ZeroStage> make_stage0(const StageContext& context);

}  // namespace dscpp
