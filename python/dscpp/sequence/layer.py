"""dscpp.sequence.layer: DeepSpeed-Ulysses' DistributedAttention (deepspeed.sequence.layer).

Each rank of a sequence-parallel group holds a slice of every sequence; around the model's own attention, one
all-to-all per tensor moves the split from the sequence to the heads (so each rank attends over whole sequences for
heads / P of the heads) and back. The exchanges are the C++ engine's (include/dscpp/sequence/distributed_attention.h,
through dscpp._C), with DeepSpeed's layout; only the local attention is Python: the model's."""
import torch
import torch.distributed as dist

from .. import _C
from ..comm import engine_comm_arguments

_comms = {}  # torch.distributed group → the dscpp._C.Comm over it, made once per group


def _comm_over(group):
    """The Comm over `group` (None: the default group). Made at the first layer over the group, which every rank
    of the job constructs at the same point of the model's construction."""
    if not dist.is_initialized():
        return _C.comm_over(None, None, "", "")
    key = group if group is not None else dist.group.WORLD
    if key not in _comms:
        _comms[key] = _C.comm_over(**engine_comm_arguments("sequence", group))
    return _comms[key]


class DistributedAttention(torch.nn.Module):
    """DeepSpeed's DistributedAttention(local_attention, sequence_process_group, scatter_idx=2, gather_idx=0).

    forward(query, key, value, batch_dim_idx, *args, **kwargs): query, key and value are [batch, seq/P, heads, dim]
    (batch_dim_idx 0) or [seq/P, batch, heads, dim] (1); local_attention(q, k, v, *args, **kwargs) sees whole
    sequences and heads/P heads, in the same layout; the result is the context for this rank's tokens. Heads must
    divide by P (a ValueError names both). Not supported, each refused by name: DeepSpeed's overlap stream
    (sp_stream), heads that do not divide by P (num_kv_heads), and rotary_pos_emb applied inside the layer."""

    def __init__(self, local_attention, sequence_process_group, scatter_idx=2, gather_idx=0, sp_stream=None,
                 num_kv_heads=None):
        super().__init__()
        if scatter_idx != 2:
            raise ValueError(f"DistributedAttention: scatter_idx is {scatter_idx}; the heads are dimension 2 "
                             "(DeepSpeed's default), the only layout supported")
        if gather_idx not in (0, 1):
            raise ValueError(f"DistributedAttention: gather_idx is {gather_idx}; 0 or 1 (the sequence dimension "
                             "follows from forward's batch_dim_idx, as in DeepSpeed)")
        if sp_stream is not None:
            raise NotImplementedError("DistributedAttention: sp_stream (DeepSpeed's communication overlap on a "
                                      "second CUDA stream) is not supported")
        self.local_attn = local_attention
        self.spg = sequence_process_group
        self.scatter_idx = scatter_idx
        self.gather_idx = gather_idx
        self.num_kv_heads = num_kv_heads
        self._comm = None  # made at the first forward: a model is often built before torch.distributed starts

    def forward(self, query, key, value, batch_dim_idx, rotary_pos_emb=None, *args, **kwargs):
        if self._comm is None:
            self._comm = _comm_over(self.spg)
            if self.num_kv_heads is not None and self.num_kv_heads % self._comm.world_size != 0:
                raise NotImplementedError(f"DistributedAttention: num_kv_heads {self.num_kv_heads} does not divide by "
                                          f"the sequence-parallel size {self._comm.world_size}; uneven head "
                                          "partitions are not supported")
        if rotary_pos_emb is not None:
            raise NotImplementedError("DistributedAttention: rotary_pos_emb is not supported; apply the rotary "
                                      "embedding to query and key before the layer, at each token's position in "
                                      "the whole sequence (it acts per position and head, so the result is the "
                                      "same)")
        return _C.distributed_attention(self._comm, lambda q, k, v: self.local_attn(q, k, v, *args, **kwargs),
                                        query, key, value, batch_dim_idx)
