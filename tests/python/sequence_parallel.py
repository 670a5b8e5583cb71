"""One DeepSpeed-Ulysses training script (tests/python/test_sequence_parallel.py): a tiny attention model whose
attention is dscpp.sequence.layer.DistributedAttention over consecutive runs of `--sp` ranks, trained through
dscpp.initialize with "sequence_parallel_size" and its data loader. Each rank embeds its positions of every sequence,
its loss is its share (its positions' mean / sp), and rank 0 writes the sequence's whole loss per step (the shares
summed over the group) to OUT as JSON. With --mesh the script makes no groups: it passes DeepSpeed's mesh_param
(data-parallel size, P) to initialize and takes the sequence group from dscpp.utils.groups (as ALST's scripts take
DeepSpeed's); either way it checks the groups' getters.

    python sequence_parallel.py --sp P --stage S [--mesh] OUT
"""
import argparse
import json

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dscpp
from dscpp.sequence.layer import DistributedAttention
from dscpp.utils import groups

p = argparse.ArgumentParser()
p.add_argument("--sp", type=int, required=True)
p.add_argument("--stage", type=int, required=True)
p.add_argument("--mesh", action="store_true")
p.add_argument("out")
args = p.parse_args()

VOCAB, DIM, HEADS, SEQ, STEPS = 16, 8, 2, 8, 6
if args.sp > 1:
    dscpp.init_distributed(dist_backend="gloo")
rank = dist.get_rank() if dist.is_initialized() else 0
world = dist.get_world_size() if dist.is_initialized() else 1
group = None
if args.sp > 1 and not args.mesh:
    for g in range(world // args.sp):  # every rank makes every group, in one order
        ranks = list(range(g * args.sp, (g + 1) * args.sp))
        made = dist.new_group(ranks)
        if rank in ranks:
            group = made
position = rank % args.sp  # which slice of each sequence this rank holds


def causal(q, k, v):
    """[B, S, h, d] attention over whole sequences."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.pos = torch.nn.Embedding(SEQ, DIM)
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB)
        self.attn = DistributedAttention(causal, group) if group is not None or not args.mesh else None

    def forward(self, tokens):
        if self.attn is None:  # --mesh: the group initialize made
            self.attn = DistributedAttention(causal, groups._get_sequence_parallel_group())
        b, s = tokens.shape
        first = position * s
        x = self.embed(tokens) + self.pos(torch.arange(first, first + s))
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, DIM // HEADS).unbind(2)
        y = self.attn(q, k, v, 0).reshape(b, s, DIM)
        return self.head(x + self.proj(y))


torch.manual_seed(0)
model = Tiny()
data = torch.utils.data.TensorDataset(torch.randint(0, VOCAB, (32, SEQ + 1), generator=torch.Generator().manual_seed(1)))
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}, "zero_optimization": {"stage": args.stage}}
if args.sp > 1 and not args.mesh:
    config["sequence_parallel_size"] = args.sp
mesh = (world // args.sp, args.sp) if args.mesh else None
engine, _, loader, _ = dscpp.initialize(model=model, config=config, training_data=data, mesh_param=mesh)
if args.sp > 1:  # DeepSpeed's getters: P consecutive ranks, the data-parallel ranks a stride of P, ZeRO over all
    assert groups._get_sequence_parallel_world_size() == args.sp and groups._get_sequence_parallel_rank() == position
    start = rank - position
    assert dist.get_process_group_ranks(groups._get_sequence_parallel_group()) == list(range(start, start + args.sp))
    assert dist.get_process_group_ranks(groups._get_data_parallel_group()) == list(range(position, world, args.sp))
    assert groups._get_data_parallel_world_size() == world // args.sp
    assert groups._get_sequence_data_parallel_world_size() == world
    if group is None:
        group = groups._get_sequence_parallel_group()
losses = []
batches = iter(loader)
for step in range(STEPS):
    (sequences,) = next(batches)
    mine = lambda t: t.chunk(args.sp, 1)[position]  # noqa: E731
    logits = engine(mine(sequences[:, :SEQ]))
    share = F.cross_entropy(logits.reshape(-1, VOCAB), mine(sequences[:, 1:]).reshape(-1)) / args.sp
    engine.backward(share)
    engine.step()
    whole = share.detach().clone()
    if group is not None:
        dist.all_reduce(whole, group=group)
    losses.append(whole.item())
if rank == 0:
    with open(args.out, "w") as f:
        json.dump(losses, f)
if dist.is_initialized():
    dist.barrier()
