// Whole-tensor dropout masks, this rank's part kept (dropout.h).
#include "model/dropout.h"

namespace gpt {

torch::Tensor dropout(const torch::Tensor& x, double p, int parts, int part) {
  auto sizes = x.sizes().vec();
  sizes[1] *= parts;
  auto keep = torch::empty(sizes, x.options()).bernoulli_(1 - p).div_(1 - p);
  // Copied so that backward keeps this rank's part, not the whole draw.
  if (parts > 1) keep = keep.chunk(parts, 1)[part].clone();
  return x * keep;
}

torch::Tensor dropout(const torch::Tensor& x, double p, const std::shared_ptr<dscpp::Comm>& sequence_group) {
  return sequence_group ? dropout(x, p, sequence_group->world_size(), sequence_group->rank()) : dropout(x, p);
}

}  // namespace gpt
