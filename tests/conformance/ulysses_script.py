"""DeepSpeed-Ulysses' DistributedAttention, one user script on real DeepSpeed and on deepspeed.cpp
(tests/conformance/test_ulysses.py): `--impl` picks the module that plays `deepspeed`.

Every rank makes the same whole query, key and value (one seed) and takes its slice of the sequence in its
sequence-parallel group (consecutive ranks, `--sp` of them; dist.new_group, as a script does); the layer runs the
script's causal attention between its all-to-alls, then one backward from a fixed upstream gradient. Rank 0 prints
one JSON line per layout (batch_dim_idx 0 and 1): every rank's output and input gradients gathered in rank order,
and the whole-sequence attention's, each as a list of floats.

    python ulysses_script.py --impl deepspeed|dscpp --sp P
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--impl", choices=["deepspeed", "dscpp"], required=True)
p.add_argument("--sp", type=int, required=True, help="sequence-parallel size (consecutive ranks)")
args = p.parse_args()

if args.impl == "deepspeed":
    import ds_cpu  # noqa: F401  (real DeepSpeed on CPU with Gloo; see ds_cpu.py)
    import deepspeed
    from deepspeed.sequence.layer import DistributedAttention
else:
    import dscpp as deepspeed
    from dscpp.sequence.layer import DistributedAttention

deepspeed.init_distributed(dist_backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()
groups = [dist.new_group(list(range(g * args.sp, (g + 1) * args.sp))) for g in range(world // args.sp)]
group = groups[rank // args.sp]
mine = rank % args.sp

B, S, H, D = 2, 8, 4, 3


def attention(q, k, v, batch_dim):
    """Causal attention over whole sequences, heads at dimension 2, in `batch_dim`'s layout."""
    to = (0, 2, 1, 3) if batch_dim == 0 else (1, 2, 0, 3)
    back = (0, 2, 1, 3) if batch_dim == 0 else (2, 0, 1, 3)
    out = torch.nn.functional.scaled_dot_product_attention(q.permute(to), k.permute(to), v.permute(to), is_causal=True)
    return out.permute(back)


def gathered(t):
    """Every rank's `t`, in rank order, flattened."""
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat([x.reshape(-1) for x in parts]).tolist()


for batch_dim in (0, 1):
    seq_dim = 1 if batch_dim == 0 else 0
    shape = (B, S, H, D) if batch_dim == 0 else (S, B, H, D)
    torch.manual_seed(11)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    upstream = torch.randn(shape)
    whole = attention(q, k, v, batch_dim)
    (whole * upstream).sum().backward()

    def piece(t):
        return t.chunk(args.sp, seq_dim)[mine]

    qs, ks, vs = (piece(t).detach().clone().requires_grad_(True) for t in (q, k, v))
    layer = DistributedAttention(lambda a, b, c: attention(a, b, c, batch_dim), group)
    out = layer(qs, ks, vs, batch_dim)
    (out * piece(upstream)).sum().backward()
    record = {"batch_dim": batch_dim, "out": gathered(out), "grads": [gathered(t.grad) for t in (qs, ks, vs)],
              "whole_out": gathered(piece(whole)), "whole_grads": [gathered(piece(t.grad)) for t in (q, k, v)]}
    if rank == 0:
        print(json.dumps(record), flush=True)
dist.barrier()
if args.impl == "deepspeed":
    # Real DeepSpeed's process sometimes aborts at interpreter exit on CPU after everything finished ("terminate
    # called without an active exception"; train_script.py says how often): the reference leaves without teardown.
    sys.stdout.flush()
    os._exit(0)
