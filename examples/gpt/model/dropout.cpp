// Whole-sequence dropout masks, this rank's positions kept (dropout.h).
#include "model/dropout.h"

namespace gpt {

torch::Tensor dropout(const torch::Tensor& x, double p, const std::shared_ptr<dscpp::Comm>& sequence_group) {
  // A Bernoulli(1 - p) draw scaled by 1 / (1 - p), spelled out (what torch::dropout does on a CPU; a GPU's fused
  // kernel draws another way, and every layout must draw alike): for the whole sequences' shape, then this rank's
  // part of dim 1, copied so that the whole draw is not kept for backward.
  const int parts = sequence_group ? sequence_group->world_size() : 1;
  auto sizes = x.sizes().vec();
  sizes[1] *= parts;
  auto keep = torch::empty(sizes, x.options()).bernoulli_(1 - p).div_(1 - p);
  if (parts > 1) keep = keep.chunk(parts, 1)[sequence_group->rank()].clone();
  return x * keep;
}

}  // namespace gpt
