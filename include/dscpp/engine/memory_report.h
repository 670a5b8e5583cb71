// ModelStateMemory: the model-state bytes one rank holds, and how they are printed and logged.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "dscpp/zero/zero_stage.h"

namespace dscpp {

struct ModelStateMemory {
  StageMemory stage;
  int64_t optimizer_state = 0;  // e.g. Adam's m and v for this rank's partition

  // The model states: parameters, gradients, fp32 master and optimizer state.
  int64_t model_states() const { return stage.params16 + stage.grads16 + stage.master + optimizer_state; }
  // Everything, communication buffers and the optimizer's fp32 gradient partition included.
  int64_t total() const { return model_states() + stage.buffers; }
};

// memory_breakdown: one rank's memory, the model states and what surrounds them.
struct MemoryBreakdown {
  ModelStateMemory states;
  // The most tensor bytes held on the training device above a forward's start, through its backward, over the
  // micro-steps so far: activations, and under ZeRO-3 the gathered parameters and gradients in flight. -1: not
  // measured (on the CPU the CpuMemoryTracker is not installed; on a GPU memory_breakdown is off, since measuring
  // resets the caching allocator's peak, which a user's torch.cuda.max_memory_allocated would see).
  int64_t activations_peak = -1;
  int64_t offloaded_host = 0;  // of the model states, what offload_optimizer / offload_param cpu keep in host memory
  int64_t nvme = 0;            // bytes in this rank's swap files (offload_* nvme), beside the model states
  int64_t rss = 0;             // the process's resident set
  // Bytes held now for live tensors on the training device: on the CPU CpuMemoryTracker::allocated (only what was
  // allocated after it was installed), on a GPU its caching allocator's count; -1 where neither is read. Unlike rss
  // (or the allocator's reserved bytes), it excludes what is kept for reuse after a free.
  int64_t live_tensors = -1;

  // For gathering every rank's breakdown in one exchange.
  std::vector<int64_t> pack() const;
  static MemoryBreakdown unpack(const int64_t* values);
  static constexpr size_t kPacked = 12;
};

// "rank 0: params 1.2 MB (gathered peak 0 B), grads …, fp32 master …, optimizer state …, buffers …, activations
// peak …, host offload …, nvme …, rss …"
std::string describe(const MemoryBreakdown& memory, int rank);
nlohmann::json to_json(const MemoryBreakdown& memory);

// "model states 1.23 MB/rank: params 200 KB, grads 200 KB, fp32 master 100 KB, optimizer 200 KB; buffers 100 KB"
std::string describe(const ModelStateMemory& memory);
nlohmann::json to_json(const ModelStateMemory& memory);

}  // namespace dscpp
