"""The tiled loss of long sequences (ALST's TiledFusedLogitsLoss): next-token cross-entropy computed a tile of
positions at a time, so a long sequence's whole logits never exist at once — the C++ dscpp::tiled_cross_entropy
(include/dscpp/sequence/tiled_loss.h), the one gpt-train's --tiled_loss uses.

    loss = tiled_cross_entropy(hidden, lm_head.weight, labels, tile=1024)   # hidden (..., C) after the final norm
"""
from .. import _C


def tiled_cross_entropy(hidden, head_weight, targets, tile, vocab=None):
    """Mean cross-entropy of hidden · head_weightᵀ against `targets` (its value and gradients are the untiled
    computation's, the softmax in fp32), `tile` positions at a time. `hidden` (..., C) and `targets` (...) are
    flattened over their leading dimensions; `vocab`: the logits' first columns that count (a padded head), default
    all. No ignore_index yet (every target must be a class: cross_entropy stops on -100), and not under
    torch.autocast (cast hidden and the head instead: ValueError)."""
    c = hidden.shape[-1]
    return _C.tiled_cross_entropy(hidden.reshape(-1, c), head_weight, targets.reshape(-1), int(tile),
                                  -1 if vocab is None else int(vocab))
