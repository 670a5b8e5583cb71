// The tiled loss of long sequences (ALST's TiledFusedLogitsLoss, issue 53): next-token cross-entropy of
// logits = hidden · headᵀ computed a tile of positions at a time. The forward keeps no logits and the backward
// recomputes each tile's, so a sequence's whole (positions × vocabulary) logits — at 32K positions and a 50K vocabulary,
// 6.4 GB in fp32 — never exist at once; at most one tile's do.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace dscpp {

// The mean over the N positions of cross_entropy(hidden · headᵀ, targets), the logits' first `vocab` columns taken
// (-1: all; a padded vocabulary's extra rows get no probability) and the softmax in fp32 — the value, and the gradients
// to `hidden` and `head`, of the untiled computation to fp32 rounding. hidden (N, C), head (V, C), targets (N) int64,
// each in [0, vocab); `tile` positions per tile (≥ 1). std::invalid_argument naming the shapes otherwise.
torch::Tensor tiled_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& head, const torch::Tensor& targets,
                                  int64_t tile, int64_t vocab = -1);

}  // namespace dscpp
