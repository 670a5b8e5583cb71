// assemble_param: one ZeRO-3 parameter made whole from the ranks' shards, for a save or GatheredParameters. Each rank
// fills the part of it its shard holds and leaves zeros elsewhere, and the ranks sum the raw bytes: exactly one rank
// holds each byte, so the sum is that byte, bit-exact in any dtype, and nothing beyond the one parameter is whole.
#pragma once

#include <torch/torch.h>

#include <functional>

#include "dscpp/comm/comm.h"
#include "dscpp/zero/flat_layout.h"

namespace dscpp {

// Parameter `slot` of `layout`, whole, in `options`. `read_mine(fragment, out)` fills `out` with this rank's fragment
// of it (FlatLayout::fragment_of). Collective over `comm`, whose rank is the layout's.
torch::Tensor assemble_param(const FlatLayout& layout, int slot, Comm& comm, const torch::TensorOptions& options,
                             const std::function<void(const ShardFragment&, torch::Tensor)>& read_mine);

}  // namespace dscpp
