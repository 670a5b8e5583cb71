"""bench/long_context: one attention layer's forward and backward (batch 1, HEADS heads of DIM) at sequence length T,
by one method, in this process; prints one JSON line: milliseconds per forward + backward (median of the repeats),
tokens per second, the peak memory the forward and backward add over their inputs (MB, the engine's count of what
CPU tensors hold: dscpp._C.memory, the memory breakdown's measure), and the layout's density (the share of the causal
triangle's blocks it computes).

Methods (all causal):
  sdpa             torch's scaled_dot_product_attention (its memory-efficient kernel on CPU): the strongest dense
                   baseline a user has
  math             softmax(QKᵀ)·V written out: the (T, T) scores whole, as attention without a fused kernel holds them
  ulysses          DeepSpeed-Ulysses over the job's ranks (torchrun's environment): each rank holds T/P positions, and
                   dscpp.sequence.layer.DistributedAttention runs sdpa over whole sequences for HEADS/P heads
  fixed, variable, bigbird, bslongformer, local
                   dscpp's block-sparse attention on DeepSpeed's unidirectional layout of that mode (block BLOCK)

    python long_context.py METHOD T [--repeat N]
"""
import argparse
import json
import os
import random
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from dscpp import _C
from dscpp.ops import sparse_attention as sa

HEADS, DIM, BLOCK = 4, 64, 64

LAYOUTS = {
    "fixed": lambda: sa.FixedSparsityConfig(HEADS, BLOCK, num_local_blocks=4, attention="unidirectional"),
    "variable": lambda: sa.VariableSparsityConfig(HEADS, BLOCK, num_random_blocks=1, local_window_blocks=[4],
                                                  global_block_indices=[0], attention="unidirectional"),
    "bigbird": lambda: sa.BigBirdSparsityConfig(HEADS, BLOCK, num_random_blocks=1, num_sliding_window_blocks=3,
                                                num_global_blocks=1, attention="unidirectional"),
    "bslongformer": lambda: sa.BSLongformerSparsityConfig(HEADS, BLOCK, num_sliding_window_blocks=3,
                                                          global_block_indices=[0], attention="unidirectional"),
    "local": lambda: sa.LocalSlidingWindowSparsityConfig(HEADS, BLOCK, num_sliding_window_blocks=3),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("method")
    p.add_argument("seq", type=int)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    T, method = args.seq, args.method
    ranks, rank, heads, positions = 1, 0, HEADS, T
    attention, density = None, 1.0
    if method == "ulysses":
        dist.init_process_group("gloo")
        ranks, rank = dist.get_world_size(), dist.get_rank()
        positions = T // ranks
        from dscpp.sequence.layer import DistributedAttention
        local = lambda q, k, v: F.scaled_dot_product_attention(  # noqa: E731  [B, S, h, d] in and out
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
        layer = DistributedAttention(local, dist.group.WORLD)
        attention = lambda q, k, v: layer(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), 0)  # noqa: E731
    elif method == "sdpa":
        attention = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    elif method == "math":
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        attention = lambda q, k, v: torch.softmax(  # noqa: E731
            (q @ k.transpose(-1, -2) / DIM ** 0.5).masked_fill(mask, float("-inf")), -1) @ v
    else:
        random.seed(0)
        layout = LAYOUTS[method]().make_layout(T)
        plan = _C.sparse_attention.BlockSparsePlan(layout, BLOCK, causal=True)
        blocks = T // BLOCK
        density = plan.scored_blocks / (HEADS * blocks * (blocks + 1) / 2)
        attention = lambda q, k, v: _C.sparse_attention.block_sparse_attention_planned(q, k, v, plan)  # noqa: E731
    _C.memory.install()
    torch.manual_seed(rank)
    q, k, v = (torch.randn(1, heads, positions, DIM, requires_grad=True) for _ in range(3))
    up = torch.randn(1, heads, positions, DIM)
    times, peak = [], 0
    for i in range(args.repeat + 1):  # the first is warm-up
        _C.memory.reset_peak()
        base = _C.memory.allocated()
        start = time.perf_counter()
        out = attention(q, k, v)
        (out.reshape(up.shape) * up).sum().backward()
        if i:  # the warm-up's one-time caches count in neither
            times.append(time.perf_counter() - start)
            peak = max(peak, (_C.memory.peak() - base) / 2**20)
        q.grad = k.grad = v.grad = out = None
    if method == "ulysses":  # the job's time is its slowest rank's; memory is per rank
        t = torch.tensor([statistics.median(times), peak], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ms, peak = t[0].item() * 1e3, t[1].item()
        dist.barrier()
    else:
        ms = statistics.median(times) * 1e3
    if rank == 0:
        name = f"ulysses{ranks}" if method == "ulysses" else method
        print(json.dumps({"method": name, "seq": T, "ms": round(ms, 1), "tokens_per_s": round(T / ms * 1e3),
                          "peak_mb": round(peak, 1), "density": round(density, 4)}), flush=True)


if __name__ == "__main__":
    main()
