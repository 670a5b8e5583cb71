"""A rank of a tensor-parallel run through dscpp.initialize(mpu=...): a small model whose MLP is Megatron-style
(column-parallel up-projection, row-parallel down-projection, their collectives written with torch.distributed as a
Megatron script writes them) over the mpu's tensor-parallel group, ZeRO over its data-parallel group. Rank 0 writes
the engine's per-step losses and a plain PyTorch loop's over the whole model (same initial values, data, AdamW and
clipping) to OUT.

    python3 tensor_parallel.py TP STAGE OUT      (torchrun's environment)
"""
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dscpp

VOCAB, DIM, HIDDEN, BATCH, SEQ, STEPS, CLIP = 16, 8, 12, 8, 4, 6, 0.05


class Mpu:
    """Megatron's parallel state, as DeepSpeed takes it: tensor-parallel groups of adjacent ranks, data-parallel
    groups across them (every rank makes every group, as torch.distributed.new_group requires)."""

    def __init__(self, tp):
        world, rank = dist.get_world_size(), dist.get_rank()
        for start in range(0, world, tp):
            group = dist.new_group(list(range(start, start + tp)))
            if start <= rank < start + tp:
                self.tensor = group
        for first in range(tp):
            group = dist.new_group(list(range(first, world, tp)))
            if rank % tp == first:
                self.data = group

    def get_tensor_model_parallel_group(self):
        return self.tensor

    def get_data_parallel_group(self):
        return self.data


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Model(torch.nn.Module):
    """The whole model when `group` is None; else this rank's slice of `whole` (its values) over `group`."""

    def __init__(self, whole=None, group=None):
        super().__init__()
        self.group = group
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.up = torch.nn.Linear(DIM, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, DIM)
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        if whole is None:
            return
        p, r = dist.get_world_size(group), dist.get_rank(group)
        with torch.no_grad():
            for name in ("embed.weight", "norm.weight", "norm.bias", "head.weight", "down.bias"):
                self.get_parameter(name).copy_(whole.get_parameter(name))
            self.up.weight = torch.nn.Parameter(whole.up.weight.chunk(p, 0)[r].clone())
            self.up.bias = torch.nn.Parameter(whole.up.bias.chunk(p, 0)[r].clone())
            self.down.weight = torch.nn.Parameter(whole.down.weight.chunk(p, 1)[r].clone())
        for param in (self.up.weight, self.up.bias, self.down.weight):
            param.tensor_model_parallel = True  # Megatron's mark: a slice, counted by every rank in the norm

    def forward(self, ids, targets):
        x = self.embed(ids)
        if self.group is None:
            y = self.down(F.gelu(self.up(x)))
        else:
            h = F.gelu(F.linear(_CopyToGroup.apply(x, self.group), self.up.weight, self.up.bias))
            y = _ReduceFromGroup.apply(F.linear(h, self.down.weight), self.group) + self.down.bias
        logits = self.head(self.norm(x + y))
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def batches():
    for k in range(STEPS):
        g = torch.Generator().manual_seed(100 + k)
        yield torch.randint(VOCAB, (BATCH, SEQ), generator=g), torch.randint(VOCAB, (BATCH, SEQ), generator=g)


def reference(whole):
    optimizer = torch.optim.AdamW(whole.parameters(), lr=0.01, weight_decay=0.1)
    losses = []
    for ids, targets in batches():
        loss = whole(ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(whole.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def gathered_parameters_under_the_mpu(model, mpu, dp_rank):
    """GatheredParameters(modifier_rank=0) over a tensor-parallel slice and a replicated parameter: modifier_rank is a
    rank of each data-parallel group (DeepSpeed's: of the partition group), so each slice takes the value its own
    group's rank 0 wrote. True on every rank when each holds what its group's modifier wrote."""
    tp_rank = dist.get_rank(mpu.tensor)
    params = [model.up.weight, model.norm.weight]
    with dscpp.zero.GatheredParameters(params, modifier_rank=0):
        if dp_rank == 0:
            model.up.weight.data.fill_(0.5 + tp_rank)
            model.norm.weight.data.fill_(2.0)
    with dscpp.zero.GatheredParameters(params):
        mine = bool((model.up.weight == 0.5 + tp_rank).all()) and bool((model.norm.weight == 2.0).all())
    agreed = torch.tensor([int(mine)])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return bool(agreed.item())


def main(tp, stage, out):
    dscpp.init_distributed()
    mpu = Mpu(tp)
    torch.manual_seed(3)
    whole = Model()
    model = Model(whole, mpu.tensor)
    dp, dp_rank = dist.get_world_size(mpu.data), dist.get_rank(mpu.data)
    config = {"train_batch_size": BATCH, "train_micro_batch_size_per_gpu": BATCH // dp, "gradient_clipping": CLIP,
              "zero_optimization": {"stage": stage},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}}
    engine, *_ = dscpp.initialize(model=model, config=config, mpu=mpu)
    rows = BATCH // dp
    losses = []
    for ids, targets in batches():
        part = slice(dp_rank * rows, (dp_rank + 1) * rows)
        engine.backward(engine(ids[part], targets[part]))
        engine.step()
        losses.append(engine.last_step()["loss"])
    gathered = gathered_parameters_under_the_mpu(model, mpu, dp_rank)
    try:
        engine.save_checkpoint("/nonexistent")
        raise AssertionError("a tensor-parallel save_checkpoint was not refused")
    except RuntimeError as e:
        assert "is a tensor-parallel slice whose place in the whole parameter is not known" in str(e), e
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"engine": losses, "reference": reference(whole), "gathered": gathered}, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
