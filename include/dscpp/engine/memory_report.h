// ModelStateMemory: the model-state bytes one rank holds (SPEC §3.6), and how they are printed and logged.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "dscpp/zero/zero_stage.h"

namespace dscpp {

struct ModelStateMemory {
  StageMemory stage;
  int64_t optimizer_state = 0;  // e.g. Adam's m and v for this rank's partition

  // The SPEC §3.6 model states: parameters, gradients, fp32 master and optimizer state.
  int64_t model_states() const { return stage.params16 + stage.grads16 + stage.master + optimizer_state; }
  // Everything, communication buffers and the optimizer's fp32 gradient partition included.
  int64_t total() const { return model_states() + stage.buffers; }
};

// "model states 1.23 MB/rank: params 200 KB, grads 200 KB, fp32 master 100 KB, optimizer 200 KB; buffers 100 KB"
std::string describe(const ModelStateMemory& memory);
nlohmann::json to_json(const ModelStateMemory& memory);

}  // namespace dscpp
