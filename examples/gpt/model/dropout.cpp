// Whole-sequence dropout masks, this rank's positions kept (dropout.h).
#include "model/dropout.h"

namespace gpt {

torch::Tensor dropout(const torch::Tensor& x, double p, const std::shared_ptr<dscpp::Comm>& sequence_group) {
  if (!sequence_group || sequence_group->world_size() == 1) return torch::dropout(x, p, /*train=*/true);
  // torch::dropout draws a Bernoulli(1 - p) tensor of the input's shape and scales it by 1 / (1 - p): the same draw
  // for the whole sequences' shape, then this rank's part of dim 1.
  auto sizes = x.sizes().vec();
  const int parts = sequence_group->world_size();
  sizes[1] *= parts;
  const auto keep = torch::empty(sizes, x.options()).bernoulli_(1 - p).div_(1 - p);
  return x * keep.chunk(parts, 1)[sequence_group->rank()];
}

}  // namespace gpt
