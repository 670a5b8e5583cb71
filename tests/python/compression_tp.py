"""A rank of a tensor-parallel model compressed through init_compression(mpu=...): a Megatron-style MLP (an mpu's
ColumnParallelLinear then RowParallelLinear, sliced over every rank) with 4-bit weights, 8-bit activations into the
column-parallel layer and l1 row pruning of it, all switched on from the first forward. Each rank compresses its own
partition (DeepSpeed's semantics); rank 0 writes to OUT whether the output, the loss and every rank's weight
gradients equal a one-process computation of the same per-partition compression over the whole weights, and the
shapes redundancy_clean leaves.

    python3 compression_tp.py OUT      (torchrun's environment)
"""
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import dscpp
from dscpp._C import compression as q
from dscpp.compression import init_compression, redundancy_clean

DIM, HIDDEN, BATCH = 8, 16, 6


class ColumnParallelLinear(torch.nn.Module):
    """Megatron's layer as an mpu carries it: this rank's output rows; returns (output, bias)."""

    def __init__(self, input_size, output_size, bias=True, gather_output=True, skip_bias_add=False):
        super().__init__()
        p = dist.get_world_size()
        self.input_size, self.output_size = input_size, output_size
        self.gather_output, self.skip_bias_add = gather_output, skip_bias_add
        self.weight = torch.nn.Parameter(torch.empty(output_size // p, input_size))
        self.bias = torch.nn.Parameter(torch.empty(output_size // p)) if bias else None


class RowParallelLinear(torch.nn.Module):
    """Megatron's layer as an mpu carries it: this rank's input columns; returns (output, bias)."""

    def __init__(self, input_size, output_size, bias=True, input_is_parallel=False, skip_bias_add=False):
        super().__init__()
        p = dist.get_world_size()
        self.input_size, self.output_size = input_size, output_size
        self.input_is_parallel, self.skip_bias_add = input_is_parallel, skip_bias_add
        self.weight = torch.nn.Parameter(torch.empty(output_size, input_size // p))
        self.bias = torch.nn.Parameter(torch.empty(output_size)) if bias else None


class Mpu:
    """Every rank in one tensor-parallel group; each rank its own data-parallel group."""
    ColumnParallelLinear = ColumnParallelLinear
    RowParallelLinear = RowParallelLinear

    def __init__(self):
        rank, world = dist.get_rank(), dist.get_world_size()
        self.tensor = dist.new_group(list(range(world)))
        for r in range(world):
            group = dist.new_group([r])
            if r == rank:
                self.data = group

    def get_model_parallel_group(self):
        return self.tensor

    def get_data_parallel_group(self):
        return self.data


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = ColumnParallelLinear(DIM, HIDDEN, gather_output=False)
        self.proj = RowParallelLinear(HIDDEN, DIM, input_is_parallel=True)

    def forward(self, x):
        h, _ = self.fc(x)
        y, _ = self.proj(torch.relu(h))
        return y


def main():
    out = sys.argv[1]
    dscpp.init_distributed(dist_backend="gloo")
    rank, p = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    whole_fc, whole_fc_b = torch.randn(HIDDEN, DIM, generator=g), torch.randn(HIDDEN, generator=g)
    whole_proj, proj_b = torch.randn(DIM, HIDDEN, generator=g), torch.randn(DIM, generator=g)
    x = torch.randn(BATCH, DIM, generator=g)
    mpu = Mpu()
    model = Mlp()
    with torch.no_grad():
        model.fc.weight.copy_(whole_fc.chunk(p, 0)[rank])
        model.fc.bias.copy_(whole_fc_b.chunk(p, 0)[rank])
        model.proj.weight.copy_(whole_proj.chunk(p, 1)[rank])
        model.proj.bias.copy_(proj_b)
    every = {"shared_parameters": {"enabled": True, "schedule_offset": 0, "quantize_weight_in_forward": True},
             "different_groups": {"wq": {"params": {"start_bits": 4, "target_bits": 4}, "modules": ["fc", "proj"]}}}
    config = {"train_micro_batch_size_per_gpu": BATCH, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "compression_training": {
                  "weight_quantization": every,
                  "activation_quantization": {"shared_parameters": {"enabled": True, "schedule_offset": 0},
                                              "different_groups": {"aq": {"params": {"bits": 8}, "modules": ["fc"]}}},
                  "row_pruning": {"shared_parameters": {"enabled": True, "schedule_offset": 0},
                                  "different_groups": {"rp": {"params": {"dense_ratio": 0.5}, "modules": ["fc"],
                                                              "related_modules": [["proj"]]}}}}}
    init_compression(model, config, mpu=mpu)
    engine, *_ = dscpp.initialize(model=model, config=config, mpu=mpu)
    y = engine(x)
    loss = (y ** 2).mean()
    engine.backward(loss)
    grads = [model.fc.weight.grad.clone(), model.proj.weight.grad.clone()]

    # One process, the same per-partition compression over the whole weights.
    fc_w = whole_fc.clone().requires_grad_()
    proj_w = whole_proj.clone().requires_grad_()
    fc_parts, fc_bias, proj_parts = [], [], []
    for s in range(p):
        w_s = q.fake_quantize(fc_w.chunk(p, 0)[s], q.SYMMETRIC, 4, 1)
        keep = q.topk_mask(whole_fc.chunk(p, 0)[s].abs().sum(dim=1), 0.5).view(-1, 1)
        fc_parts.append(w_s * keep)
        fc_bias.append(whole_fc_b.chunk(p, 0)[s] * keep.view(-1))
        proj_parts.append(q.fake_quantize(proj_w.chunk(p, 1)[s], q.SYMMETRIC, 4, 1))
    xq = q.fake_quantize(x, q.SYMMETRIC, 8, x.numel() // x.size(-1))
    h = torch.relu(F.linear(xq, torch.cat(fc_parts), torch.cat(fc_bias)))
    ref = F.linear(h, torch.cat(proj_parts, dim=1), proj_b)
    ref_loss = (ref ** 2).mean()
    ref_loss.backward()
    ok = {"output": bool((y - ref).abs().max() < 1e-5), "loss": abs(float(loss) - float(ref_loss)) < 1e-6,
          "fc_grad": bool((grads[0] - fc_w.grad.chunk(p, 0)[rank]).abs().max() < 1e-5),
          "proj_grad": bool((grads[1] - proj_w.grad.chunk(p, 1)[rank]).abs().max() < 1e-5)}
    engine.step()
    redundancy_clean(model, config, mpu=mpu)
    shapes = [list(model.fc.weight.shape), list(model.proj.weight.shape)]
    results = [None] * p
    dist.all_gather_object(results, {"ok": ok, "shapes": shapes, "type": type(model.fc).__name__})
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
