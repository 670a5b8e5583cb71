"""DeepSpeed's SparseSelfAttention: attention over a layout's blocks only. Its layout for max_seq_length is made once
(a buffer, rank 0's on every rank), a shorter sequence uses its top-left corner; the computation is the C++ engine's
block-sparse attention, differentiable, on any floating dtype."""
import torch
import torch.distributed as dist
from torch import nn

from ... import _C
from .sparsity_config import SparsityConfig

_MODES = ("add", "mul")


class SparseSelfAttention(nn.Module):
    def __init__(self, sparsity_config=SparsityConfig(num_heads=4), key_padding_mask_mode="add",
                 attn_mask_mode="mul", max_seq_length=2048):
        super().__init__()
        for name, mode in (("key_padding_mask_mode", key_padding_mask_mode), ("attn_mask_mode", attn_mask_mode)):
            if mode not in _MODES:
                raise ValueError(f"SparseSelfAttention: {name} must be 'add' or 'mul', got {mode!r}")
        self.sparsity_config = sparsity_config
        self.register_buffer("master_layout", sparsity_config.make_layout(max_seq_length))
        self._need_layout_synchronization = True
        self._plans = {}  # (seq_len, device) → the layout's corner made ready to compute with
        self.key_padding_mask_mode = key_padding_mask_mode
        self.attn_mask_mode = attn_mask_mode

    def __getstate__(self):  # plans are made again where the module goes (deepcopy, pickling)
        return {**self.__dict__, "_plans": {}}

    def get_layout(self, L):
        # The random blocks were drawn by each rank's own `random`: rank 0's layout is everyone's (DeepSpeed's rule).
        if self._need_layout_synchronization and dist.is_initialized():
            dist.broadcast(self.master_layout, src=0)
            self._need_layout_synchronization = False
        if L % self.sparsity_config.block != 0:
            raise ValueError(f"Sequence Length, {L}, needs to be dividable by Block size {self.sparsity_config.block}!")
        num_blocks = L // self.sparsity_config.block
        if num_blocks > self.master_layout.size(-1):
            raise ValueError(f"SparseSelfAttention: a sequence of {L} is longer than max_seq_length "
                             f"{self.master_layout.size(-1) * self.sparsity_config.block} the layout was made for")
        return self.master_layout[..., :num_blocks, :num_blocks]

    @staticmethod
    def transpose_key_for_scores(x, L):
        bsz, num_heads, seq_len, head_dim = x.size()
        if seq_len != L:
            return x.permute(0, 1, 3, 2)
        return x

    @staticmethod
    def transpose_mask_for_sparse(qtype, x, is_key_padding_mask=False):
        x = x.type(qtype)
        if is_key_padding_mask:
            for d in range(x.dim() - 1, 0, -1):
                x = x.squeeze(dim=d)
            return x
        return x.squeeze()

    def forward(self, query, key, value, rpe=None, key_padding_mask=None, attn_mask=None):
        """query, key, value (batch, heads, seq_len, head_dim) — key may come transposed (…, head_dim, seq_len);
        rpe dense (…, seq_len, seq_len), added to the scaled scores; key_padding_mask (batch, seq_len) and attn_mask
        (seq_len, seq_len), added or multiplied as the modes say. Returns (batch, heads, seq_len, head_dim)."""
        bsz, num_heads, tgt_len, head_dim = query.size()
        key = self.transpose_key_for_scores(key, tgt_len)
        if query.shape != key.shape or key.shape != value.shape:
            raise NotImplementedError("only self-attention is supported for now")
        if num_heads != self.sparsity_config.num_heads:
            raise ValueError(f"SparseSelfAttention: the sparsity config has {self.sparsity_config.num_heads} heads, "
                             f"the query {num_heads}")
        if key_padding_mask is not None:
            key_padding_mask = self.transpose_mask_for_sparse(query.dtype, key_padding_mask, is_key_padding_mask=True)
        if attn_mask is not None:
            attn_mask = self.transpose_mask_for_sparse(query.dtype, attn_mask)
        layout = self.get_layout(tgt_len)  # rank 0's layout on every rank from the first call on
        # Once per length, device and layout version (a broadcast or a loaded checkpoint writes the layout in place),
        # as DeepSpeed makes its kernels' tables per length.
        cache_key = (tgt_len, query.device, self.master_layout._version)
        plan = self._plans.get(cache_key)
        if plan is None:
            plan = _C.sparse_attention.BlockSparsePlan(layout, self.sparsity_config.block, device=query.device)
            self._plans = {k: v for k, v in self._plans.items() if k[2] == cache_key[2]}  # older layouts' go
            self._plans[cache_key] = plan
        return _C.sparse_attention.block_sparse_attention_planned(
            query, key, value, plan, scale=float(head_dim) ** -0.5, rpe=rpe, key_padding_mask=key_padding_mask,
            key_padding_mask_mul=self.key_padding_mask_mode == "mul", attn_mask=attn_mask,
            attn_mask_mul=self.attn_mask_mode == "mul")
