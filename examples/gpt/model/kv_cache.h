// KvCache: what generation keeps between forwards of the same sequences — each block's keys and values of every
// position so far, and which positions hold tokens. A forward over new positions then computes only them: its queries
// attend to the cached keys and to each other, causally (GptImpl::forward_cached).
#pragma once

#include <torch/torch.h>

#include <vector>

namespace gpt {

// One attention's share of the cache. Under tensor parallelism each rank caches its own heads.
struct AttentionCache {
  torch::Tensor keys, values;  // (B, heads, positions so far, head_dim); undefined before the first forward
  // Set by GptImpl::forward_cached for its forward: (B, 1, new positions, positions so far + new) bool, true where
  // a query may attend to a key (scaled_dot_product_attention's mask).
  torch::Tensor allowed;
};

struct KvCache {
  std::vector<AttentionCache> layers;  // one per block, in order
  // (B, positions so far) bool: a token, not left padding (prompts of unequal length are padded on the left, so
  // every row's next token goes in the same column). Undefined before the first forward.
  torch::Tensor valid;

  int64_t length() const { return valid.defined() ? valid.size(1) : 0; }
};

}  // namespace gpt
