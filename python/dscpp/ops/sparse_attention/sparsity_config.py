"""DeepSpeed's SparsityConfig classes, same constructor arguments, defaults and errors. make_layout(seq_len) returns
the (num_heads, seq_len // block, seq_len // block) int64 layout; the rules are the C++ engine's, and the random
blocks (Variable, BigBird) come from Python's global `random`, as DeepSpeed's do — so random.seed(s) before building
gives DeepSpeed's layout, and gpt-train --seed s gives the same one."""
import random

import torch

from ... import _C

_ATTENTIONS = ("unidirectional", "bidirectional")


def _sample(n, k):
    return random.sample(range(n), k)


class SparsityConfig:
    """The shared part: heads, block size, one layout for all heads or one per head. A subclass of your own
    overrides make_layout, using setup_layout and check_and_propagate_first_head_layout as DeepSpeed's do."""
    _mode = None

    def __init__(self, num_heads, block=16, different_layout_per_head=False):
        self.num_heads = num_heads
        self.block = block
        self.different_layout_per_head = different_layout_per_head
        self.num_layout_heads = num_heads if different_layout_per_head else 1

    def setup_layout(self, seq_len):
        if seq_len % self.block != 0:
            raise ValueError(f"Sequence Length, {seq_len}, needs to be dividable by Block size {self.block}!")
        num_blocks = seq_len // self.block
        return torch.zeros((self.num_heads, num_blocks, num_blocks), dtype=torch.int64)

    def check_and_propagate_first_head_layout(self, layout):
        if not self.different_layout_per_head:
            layout[1:self.num_heads, :, :] = layout[0, :, :]
        return layout

    def _native(self):
        """The C++ description of this layout (the rules live there)."""
        c = _C.sparse_attention.SparsityConfig()
        c.mode = self._mode
        c.num_heads = self.num_heads
        c.block = self.block
        c.different_layout_per_head = self.different_layout_per_head
        for name in ("num_local_blocks", "num_global_blocks", "horizontal_global_attention",
                     "num_different_global_patterns", "num_random_blocks", "local_window_blocks",
                     "global_block_indices", "global_block_end_indices", "num_sliding_window_blocks"):
            if hasattr(self, name):
                setattr(c, name, getattr(self, name))
        attention = getattr(self, "attention", "bidirectional")
        # DeepSpeed's local layout is one-sided unless "bidirectional"; the others are two-sided unless "unidirectional".
        c.unidirectional = attention != "bidirectional" if self._mode == "local" else attention == "unidirectional"
        return c

    def _check(self):
        self._native().validate()  # ValueError with the numbers, as DeepSpeed's constructors raise them

    def make_layout(self, seq_len):
        if self._mode is None:
            raise NotImplementedError("SparsityConfig is abstract: use one of its subclasses, or override "
                                      "make_layout")
        self.setup_layout(seq_len)  # DeepSpeed's divisibility error first
        return _C.sparse_attention.make_layout(self._native(), seq_len, _sample)


def _check_attention(attention, horizontal_global_attention=False):
    if attention not in _ATTENTIONS:
        raise NotImplementedError('only "uni/bi-directional" attentions are supported for now!')
    if attention != "bidirectional" and horizontal_global_attention:
        raise ValueError('only "bi-directional" attentions can support horizontal global attention!')


class DenseSparsityConfig(SparsityConfig):
    """Every block (for comparison)."""
    _mode = "dense"


class FixedSparsityConfig(SparsityConfig):
    """Local windows of num_local_blocks, their last num_global_blocks global (Sparse Transformers' fixed)."""
    _mode = "fixed"

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_local_blocks=4, num_global_blocks=1,
                 attention="bidirectional", horizontal_global_attention=False, num_different_global_patterns=1):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_attention(attention, horizontal_global_attention)
        self.num_local_blocks = num_local_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention
        self.horizontal_global_attention = horizontal_global_attention
        self.num_different_global_patterns = num_different_global_patterns
        self._check()


class VariableSparsityConfig(SparsityConfig):
    """Random blocks, local windows of the given sizes, global blocks by index or range."""
    _mode = "variable"

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=0,
                 local_window_blocks=(4,), global_block_indices=(0,), global_block_end_indices=None,
                 attention="bidirectional", horizontal_global_attention=False):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_attention(attention, horizontal_global_attention)
        self.num_random_blocks = num_random_blocks
        self.local_window_blocks = list(local_window_blocks)
        self.global_block_indices = list(global_block_indices)
        self.global_block_end_indices = None if global_block_end_indices is None else list(global_block_end_indices)
        self.attention = attention
        self.horizontal_global_attention = horizontal_global_attention
        self._check()


class BigBirdSparsityConfig(SparsityConfig):
    """Random blocks, a sliding window, the first blocks global (BigBird)."""
    _mode = "bigbird"

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_random_blocks=1,
                 num_sliding_window_blocks=3, num_global_blocks=1, attention="bidirectional"):
        super().__init__(num_heads, block, different_layout_per_head)
        _check_attention(attention)
        self.num_random_blocks = num_random_blocks
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention
        self._check()


class BSLongformerSparsityConfig(SparsityConfig):
    """A sliding window and global blocks by index or range (block-sparse Longformer)."""
    _mode = "bslongformer"

    def __init__(self, num_heads, block=16, different_layout_per_head=False, num_sliding_window_blocks=3,
                 global_block_indices=(0,), global_block_end_indices=None, attention="bidirectional"):
        super().__init__(num_heads, block, different_layout_per_head)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.global_block_indices = list(global_block_indices)
        self.global_block_end_indices = None if global_block_end_indices is None else list(global_block_end_indices)
        self.attention = attention  # DeepSpeed's class takes any string; only "unidirectional" changes the layout
        self._check()


class LocalSlidingWindowSparsityConfig(SparsityConfig):
    """A sliding window only."""
    _mode = "local"

    def __init__(self, num_heads, block=16, num_sliding_window_blocks=3, attention="unidirectional"):
        super().__init__(num_heads, block)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.attention = attention
        self._check()


_CLASSES = {"dense": DenseSparsityConfig, "fixed": FixedSparsityConfig, "variable": VariableSparsityConfig,
            "bigbird": BigBirdSparsityConfig, "bslongformer": BSLongformerSparsityConfig}


def sparsity_config_from_dict(section, num_heads):
    """The SparsityConfig a DeepSpeed config's "sparse_attention" section describes, for a model of `num_heads` heads
    (what DeepSpeed's examples build from `ds_config["sparse_attention"]`). The section is checked by the engine's
    parse first: a key its mode does not read is a ValueError naming it."""
    import json
    c = _C.sparse_attention.parse_config(json.dumps(section))
    args = dict(num_heads=num_heads, block=c.block)
    if c.mode != "dense":
        args["different_layout_per_head"] = c.different_layout_per_head
        args["attention"] = "unidirectional" if c.unidirectional else "bidirectional"
    if c.mode == "fixed":
        args.update(num_local_blocks=c.num_local_blocks, num_global_blocks=c.num_global_blocks,
                    horizontal_global_attention=c.horizontal_global_attention,
                    num_different_global_patterns=c.num_different_global_patterns)
    elif c.mode == "variable":
        args.update(num_random_blocks=c.num_random_blocks, local_window_blocks=c.local_window_blocks,
                    global_block_indices=c.global_block_indices,
                    global_block_end_indices=c.global_block_end_indices,
                    horizontal_global_attention=c.horizontal_global_attention)
    elif c.mode == "bigbird":
        args.update(num_random_blocks=c.num_random_blocks, num_sliding_window_blocks=c.num_sliding_window_blocks,
                    num_global_blocks=c.num_global_blocks)
    elif c.mode == "bslongformer":
        args.update(num_sliding_window_blocks=c.num_sliding_window_blocks,
                    global_block_indices=c.global_block_indices,
                    global_block_end_indices=c.global_block_end_indices)
    return _CLASSES[c.mode](**args)
