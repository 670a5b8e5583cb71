// Tiled cross-entropy: a custom autograd function whose forward sums each tile's loss and whose backward recomputes
// each tile's logits to form its gradient (softmax − one-hot), so no tile's logits outlive the tile.
#include "dscpp/sequence/tiled_loss.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace dscpp {
namespace {

std::string shape(const torch::Tensor& t) {
  std::string out = "(";
  for (int64_t i = 0; i < t.dim(); ++i) out += (i ? ", " : "") + std::to_string(t.size(i));
  return out + ")";
}

// One tile's fp32 logits over the vocabulary's first `vocab` columns.
torch::Tensor tile_logits(const torch::Tensor& hidden_tile, const torch::Tensor& head, int64_t vocab) {
  return hidden_tile.matmul(head.t()).narrow(-1, 0, vocab).to(torch::kFloat);
}

class TiledCrossEntropy : public torch::autograd::Function<TiledCrossEntropy> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& head, const torch::Tensor& targets, int64_t tile, int64_t vocab) {
    const int64_t n = hidden.size(0);
    torch::Tensor total = torch::zeros({}, hidden.options().dtype(torch::kFloat));
    for (int64_t start = 0; start < n; start += tile) {
      const int64_t rows = std::min(tile, n - start);
      total += torch::nn::functional::cross_entropy(
          tile_logits(hidden.narrow(0, start, rows), head, vocab), targets.narrow(0, start, rows),
          // No ignored label: an ignored target (Hugging Face's -100) would leave the sum but not N, so every
          // target must be a class — cross_entropy stops on one that is not, with no host sync here.
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(
              std::numeric_limits<int64_t>::min()));
    }
    ctx->save_for_backward({hidden, head, targets});
    ctx->saved_data["tile"] = tile;
    ctx->saved_data["vocab"] = vocab;
    return total / static_cast<double>(n);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &hidden = saved[0], &head = saved[1], &targets = saved[2];
    const int64_t tile = ctx->saved_data["tile"].toInt(), vocab = ctx->saved_data["vocab"].toInt();
    const int64_t n = hidden.size(0);
    const torch::Tensor scale = grads[0].to(torch::kFloat) / static_cast<double>(n);
    torch::Tensor grad_hidden = torch::empty_like(hidden);
    // Summed over the tiles in fp32 and rounded once, as the untiled product accumulates (bf16/fp16 heads).
    torch::Tensor grad_head = torch::zeros(head.sizes(), head.options().dtype(torch::kFloat));
    for (int64_t start = 0; start < n; start += tile) {
      const int64_t rows = std::min(tile, n - start);
      const torch::Tensor h = hidden.narrow(0, start, rows);
      // d loss / d logits of the tile: (softmax − one-hot) / N, the untiled backward's, in fp32.
      torch::Tensor d = torch::softmax(tile_logits(h, head, vocab), -1);
      d.scatter_add_(1, targets.narrow(0, start, rows).unsqueeze(1), -torch::ones({rows, 1}, d.options()));
      d = (d * scale).to(hidden.scalar_type());
      if (vocab < head.size(0)) d = torch::constant_pad_nd(d, {0, head.size(0) - vocab});
      grad_hidden.narrow(0, start, rows).copy_(d.matmul(head));
      grad_head += d.t().matmul(h).to(torch::kFloat);
    }
    return {grad_hidden, grad_head.to(head.scalar_type()), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor tiled_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& head, const torch::Tensor& targets,
                                  int64_t tile, int64_t vocab) {
  if (vocab < 0) vocab = head.size(0);
  const bool ok = hidden.dim() == 2 && head.dim() == 2 && targets.dim() == 1 && hidden.size(1) == head.size(1) &&
                  targets.size(0) == hidden.size(0) && hidden.size(0) > 0 && vocab > 0 && vocab <= head.size(0);
  if (!ok) {
    throw std::invalid_argument("tiled_cross_entropy: hidden " + shape(hidden) + ", head " + shape(head) +
                                ", targets " + shape(targets) + ", vocab " + std::to_string(vocab) +
                                ": expected hidden (N, C), head (V, C), targets (N), 0 < vocab <= V");
  }
  if (tile < 1) throw std::invalid_argument("tiled_cross_entropy: tile " + std::to_string(tile) + ": at least 1");
  // The backward recomputes the logits outside any autocast region, which would differentiate another function.
  if (at::autocast::is_autocast_enabled(at::kCPU) || at::autocast::is_autocast_enabled(at::kCUDA)) {
    throw std::invalid_argument("tiled_cross_entropy: not under autocast yet; cast hidden and head to the dtype to "
                                "compute in instead");
  }
  return TiledCrossEntropy::apply(hidden, head, targets, tile, vocab);
}

}  // namespace dscpp
