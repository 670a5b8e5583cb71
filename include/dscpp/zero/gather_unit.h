// GatherUnit: ZeRO-3's unit of gathering — parameters gathered and released together (a transformer block, FSDP2's
// fully_shard unit), named by the front end that chose them.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace dscpp {

struct GatherUnit {
  std::string name;                   // for logs, errors and the flops profiler ("blocks.3")
  std::vector<torch::Tensor> params;  // the unit's parameters; one in two units belongs to the first
};

}  // namespace dscpp
